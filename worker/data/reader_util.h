// Pieces the readers share: reading a whole file, error messages that name
// the file, number parsing, little/big-endian loads, and the checks every
// cloud passes before it is returned. Internal to worker/data.
#ifndef TRAINSUP_WORKER_DATA_READER_UTIL_H_
#define TRAINSUP_WORKER_DATA_READER_UTIL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/data/point_cloud.h"

namespace trainsup::worker::internal {

// Both take a message whose pieces of file content are marked with
// FileContent (point_cloud.h), so that ViewerMessage can withhold them.
//
// "<path>: <message>" as InvalidArgument: the file is not what the reader
// was asked to read, or uses something the reader does not support.
absl::Status InvalidFile(const std::string& path, absl::string_view message);
// "<path>: <message>" as DataLoss: the file is damaged (truncated, a count
// that does not match, a non-finite value, a token that is not a number).
absl::Status CorruptFile(const std::string& path, absl::string_view message);

// With options.data_roots set: OK when the file or folder open as `fd`
// lies inside one of the roots (its real path, from /proc/self/fd);
// PermissionDenied "<path>: leads to <real path>, outside the data roots
// (<roots>)" otherwise, or when the real path cannot be read back.
absl::Status CheckConfined(int fd, const std::string& path, const ReadOptions& options);

// The whole file, read with one read(2) loop into a buffer sized from
// fstat. Anything but a regular file (a FIFO, a device, a socket) is
// refused without being opened, and the open itself never blocks. NotFound
// when it does not exist, PermissionDenied when it lies outside
// options.data_roots (CheckConfined), InvalidArgument when it is not a
// regular file, cannot be opened or is larger than options.max_file_bytes
// (checked before the buffer is allocated), DataLoss when reading fails or
// the file changes size underneath.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const ReadOptions& options);

// The names in folder `dir` (without "." and ".."), sorted, with the
// folder confined like ReadWholeFile's files. InvalidArgument when it
// cannot be listed.
absl::StatusOr<std::vector<std::string>> ListFolder(const std::string& dir,
                                                    const ReadOptions& options);

// Whether `path` exists (any kind), and whether it is a directory.
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

// Parses all of [begin, end) as a number (a leading '+' is allowed; "nan"
// and "inf" parse, the finiteness checks come later). False when anything
// is left over or the text is not a number.
bool ParseDouble(const char* begin, const char* end, double* out);
bool ParseInt64(const char* begin, const char* end, int64_t* out);

// a * b + c <= limit without overflow.
bool FitsIn(uint64_t a, uint64_t b, uint64_t c, uint64_t limit);

// Loads a T stored at p in little- or big-endian byte order.
template <typename T>
T Load(const char* p, bool big_endian) {
  static_assert(sizeof(T) <= 8);
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, p, sizeof(T));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  const bool swap = !big_endian;
#else
  const bool swap = big_endian;
#endif
  if (swap) {
    for (size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(bytes[i], bytes[sizeof(T) - 1 - i]);
  }
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}
template <typename T>
T LoadLE(const char* p) {
  return Load<T>(p, /*big_endian=*/false);
}

// Lines of a text file, split into whitespace-separated tokens. Line numbers
// start at 1.
class TextLines {
 public:
  explicit TextLines(absl::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}
  // Advances to the next line that has a token; false at the end. Fills
  // `tokens` with that line's tokens.
  bool Next(std::vector<absl::string_view>* tokens);
  int line() const { return line_; }

 private:
  const char* p_;
  const char* end_;
  int line_ = 0;
};

// Converts double coordinates into cloud->xyz, failing on a non-finite one
// (naming the point, the axis and the value). With `recenter`, origin is the
// floor of the bounding-box minimum and xyz are relative to it.
absl::Status SetCoordinates(const std::string& path, const std::vector<double>& xyz, bool recenter,
                            PointCloud* cloud);
// Fails on a non-finite feature, naming the point and the channel.
absl::Status CheckFeatures(const std::string& path, const PointCloud& cloud);
// Fails on a label below -1, naming the point.
absl::Status CheckLabels(const std::string& path, const std::vector<int32_t>& labels);

// Labels from a text side file, one integer per line; DataLoss when a line
// is not an integer in [-1, 2^31) or the count is not `expected`.
absl::StatusOr<std::vector<int32_t>> ReadLabelFile(const std::string& path, size_t expected,
                                                   const ReadOptions& options);

// What every reader does last: labels from options.label_file (replacing the
// file's own), options.require_labels, and the label range check.
absl::Status FinishLabels(const std::string& path, const ReadOptions& options, PointCloud* cloud);

}  // namespace trainsup::worker::internal

#endif  // TRAINSUP_WORKER_DATA_READER_UTIL_H_
