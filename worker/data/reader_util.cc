#include "worker/data/reader_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_join.h"
#include "contracts/data_roots.h"

namespace trainsup::worker::internal {

absl::Status InvalidFile(const std::string& path, absl::string_view message) {
  return ContentError(absl::StatusCode::kInvalidArgument, absl::StrCat(path, ": ", message));
}

absl::Status CorruptFile(const std::string& path, absl::string_view message) {
  return ContentError(absl::StatusCode::kDataLoss, absl::StrCat(path, ": ", message));
}

absl::Status CheckConfined(int fd, const std::string& path, const ReadOptions& options) {
  if (!options.data_roots.has_value()) return absl::OkStatus();
  const std::vector<std::string>& roots = *options.data_roots;
  const std::string roots_text = roots.empty() ? "none configured" : absl::StrJoin(roots, ", ");
  // What the kernel opened, every symlink resolved: a link swapped in
  // after any earlier check is seen here.
  char real[PATH_MAX + 1];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(link.c_str(), real, PATH_MAX);
  if (n <= 0 || real[0] != '/') {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot tell where it leads (", link,
                     " unreadable), so it is not read (data roots: ", roots_text, ")"));
  }
  const std::string resolved(real, static_cast<size_t>(n));
  if (!PathInsideRoots(resolved, roots)) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": leads to ", resolved, ", outside the data roots (", roots_text, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const ReadOptions& options) {
  // A FIFO would block open(2) until a writer came, a device may do
  // anything on open: only regular files are opened, and O_NONBLOCK covers
  // one swapped in after the stat.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return InvalidFile(path, "not a regular file");
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return InvalidFile(path, absl::StrCat("cannot open: ", std::strerror(err)));
  }
  if (absl::Status confined = CheckConfined(fd, path, options); !confined.ok()) {
    ::close(fd);
    return confined;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidFile(path, "not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (options.max_file_bytes > 0 && size > options.max_file_bytes) {
    ::close(fd);
    constexpr uint64_t kMiB = uint64_t{1} << 20;
    return InvalidFile(path, absl::StrCat((size + kMiB - 1) / kMiB, " MiB (", size,
                                          " bytes) is more than data.max_file_mb (",
                                          options.max_file_bytes / kMiB, " MiB)"));
  }
  std::string data(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      return CorruptFile(path, n < 0
                                   ? absl::StrCat("read failed: ", std::strerror(err))
                                   : absl::StrCat("file shrank to ", done, " bytes while reading"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

absl::StatusOr<std::vector<std::string>> ListFolder(const std::string& dir,
                                                    const ReadOptions& options) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return InvalidFile(dir, absl::StrCat("cannot list the folder: ", std::strerror(errno)));
  }
  if (absl::Status confined = CheckConfined(fd, dir, options); !confined.ok()) {
    ::close(fd);
    return confined;
  }
  DIR* d = ::fdopendir(fd);  // owns fd from here
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return InvalidFile(dir, absl::StrCat("cannot list the folder: ", std::strerror(err)));
  }
  std::vector<std::string> names;
  errno = 0;
  while (const struct dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0)
    return InvalidFile(dir, absl::StrCat("cannot list the folder: ", std::strerror(err)));
  std::sort(names.begin(), names.end());
  return names;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool ParseDouble(const char* begin, const char* end, double* out) {
  if (begin < end && *begin == '+') ++begin;
  if (begin == end) return false;
  auto [ptr, ec] = std::from_chars(begin, end, *out);
  // Out of range ("1e999") is treated as infinity so the finiteness check
  // names it, instead of calling the token not a number.
  if (ec == std::errc::result_out_of_range && ptr == end) {
    *out = (*begin == '-') ? -std::numeric_limits<double>::infinity()
                           : std::numeric_limits<double>::infinity();
    return true;
  }
  return ec == std::errc() && ptr == end;
}

bool ParseInt64(const char* begin, const char* end, int64_t* out) {
  if (begin < end && *begin == '+') ++begin;
  if (begin == end) return false;
  auto [ptr, ec] = std::from_chars(begin, end, *out);
  return ec == std::errc() && ptr == end;
}

bool FitsIn(uint64_t a, uint64_t b, uint64_t c, uint64_t limit) {
  if (c > limit) return false;
  if (a == 0 || b == 0) return true;
  return a <= (limit - c) / b;
}

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

bool TextLines::Next(std::vector<absl::string_view>* tokens) {
  while (p_ < end_) {
    tokens->clear();
    ++line_;
    while (p_ < end_ && *p_ != '\n') {
      while (p_ < end_ && IsSpace(*p_)) ++p_;
      const char* start = p_;
      while (p_ < end_ && *p_ != '\n' && !IsSpace(*p_)) ++p_;
      if (p_ > start) tokens->emplace_back(start, static_cast<size_t>(p_ - start));
    }
    if (p_ < end_) ++p_;  // the '\n'
    if (!tokens->empty()) return true;
  }
  return false;
}

absl::Status SetCoordinates(const std::string& path, const std::vector<double>& xyz, bool recenter,
                            PointCloud* cloud) {
  static constexpr char kAxis[3] = {'x', 'y', 'z'};
  std::array<double, 3> lo = {0, 0, 0};
  for (size_t i = 0; i < xyz.size(); ++i) {
    const double v = xyz[i];
    if (!std::isfinite(v)) {
      return CorruptFile(path, absl::StrCat("non-finite coordinate ", std::string(1, kAxis[i % 3]),
                                            " = ", v, " at point ", i / 3));
    }
    if (i < 3 || v < lo[i % 3]) lo[i % 3] = v;
  }
  cloud->origin = {0, 0, 0};
  if (recenter && !xyz.empty()) {
    for (int a = 0; a < 3; ++a) cloud->origin[a] = std::floor(lo[a]);
  }
  cloud->xyz.resize(xyz.size());
  for (size_t i = 0; i < xyz.size(); ++i) {
    const double v = xyz[i] - cloud->origin[i % 3];
    if (std::fabs(v) > std::numeric_limits<float>::max()) {
      return CorruptFile(path, absl::StrCat("coordinate ", std::string(1, kAxis[i % 3]), " = ",
                                            FileContent(absl::StrCat(xyz[i])), " at point ", i / 3,
                                            " does not fit in float"));
    }
    cloud->xyz[i] = static_cast<float>(v);
  }
  return absl::OkStatus();
}

absl::Status CheckFeatures(const std::string& path, const PointCloud& cloud) {
  const size_t c = static_cast<size_t>(cloud.feature_channels);
  if (c == 0) return absl::OkStatus();
  for (size_t i = 0; i < cloud.features.size(); ++i) {
    if (!std::isfinite(cloud.features[i])) {
      return CorruptFile(path, absl::StrCat("non-finite feature ", i % c, " = ", cloud.features[i],
                                            " at point ", i / c));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLabels(const std::string& path, const std::vector<int32_t>& labels) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < -1) {
      return CorruptFile(path, absl::StrCat("label ", FileContent(absl::StrCat(labels[i])),
                                            " at point ", i, " is below -1 (the unlabelled mark)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> ReadLabelFile(const std::string& path, size_t expected,
                                                   const ReadOptions& options) {
  absl::StatusOr<std::string> text = ReadWholeFile(path, options);
  if (!text.ok()) return text.status();
  std::vector<int32_t> labels;
  labels.reserve(expected);
  size_t count = 0;
  TextLines lines(*text);
  std::vector<absl::string_view> tokens;
  while (lines.Next(&tokens)) {
    if (tokens.size() != 1) {
      return CorruptFile(path, absl::StrCat("line ", lines.line(), ": expected one label, found ",
                                            tokens.size(), " tokens"));
    }
    int64_t v = 0;
    const absl::string_view t = tokens[0];
    if (!ParseInt64(t.data(), t.data() + t.size(), &v) || v < -1 ||
        v > std::numeric_limits<int32_t>::max()) {
      return CorruptFile(path, absl::StrCat("line ", lines.line(), ": '", FileContent(t),
                                            "' is not a label (an integer >= -1)"));
    }
    if (count < expected) labels.push_back(static_cast<int32_t>(v));
    ++count;
  }
  if (count != expected) {
    return CorruptFile(
        path, absl::StrCat("label count mismatch: ", count, " labels for ", expected, " points"));
  }
  return labels;
}

absl::Status FinishLabels(const std::string& path, const ReadOptions& options, PointCloud* cloud) {
  if (!options.label_file.empty()) {
    absl::StatusOr<std::vector<int32_t>> labels =
        ReadLabelFile(options.label_file, cloud->size(), options);
    if (!labels.ok()) return labels.status();
    cloud->labels = *std::move(labels);
  }
  if (cloud->labels.empty() && options.require_labels && cloud->size() > 0) {
    return InvalidFile(path, "no labels (labels are required; set a label property or file)");
  }
  if (!cloud->labels.empty() && cloud->labels.size() != cloud->size()) {
    return CorruptFile(path, absl::StrCat("label count mismatch: ", cloud->labels.size(),
                                          " labels for ", cloud->size(), " points"));
  }
  return CheckLabels(path, cloud->labels);
}

}  // namespace trainsup::worker::internal
