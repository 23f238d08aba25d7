#include "worker/data/las.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "worker/data/reader_util.h"

namespace trainsup::worker {
namespace {

using internal::CorruptFile;
using internal::InvalidFile;
using internal::LoadLE;

// Offsets in the public header block (LAS 1.4 R15, table 3).
constexpr size_t kVersionMajor = 24;
constexpr size_t kVersionMinor = 25;
constexpr size_t kHeaderSize = 94;
constexpr size_t kOffsetToPointData = 96;
constexpr size_t kPointFormat = 104;
constexpr size_t kRecordLength = 105;
constexpr size_t kLegacyPointCount = 107;
constexpr size_t kScale = 131;
constexpr size_t kOffset = 155;
constexpr size_t kPointCount64 = 247;
// Header sizes: 1.0-1.2, and 1.4 (1.3 adds 8 bytes to the first).
constexpr size_t kMinHeaderSize = 227;
constexpr size_t kHeaderSize14 = 375;

// Record sizes of point formats 0-3, and where rgb starts in 2 and 3.
constexpr uint16_t kRecordSize[4] = {20, 28, 26, 34};
constexpr size_t kRgbOffset[4] = {0, 0, 20, 28};
constexpr size_t kClassification = 15;

// Where and how the point records lie, from a checked header.
struct PointLayout {
  int format = 0;  // point data format, 0-3
  uint64_t point_offset = 0;
  uint64_t record_length = 0;  // at least kRecordSize[format]
  uint64_t count = 0;          // records, all inside the file
  double scale[3], offset[3];  // finite; no scale is 0
};

// The point count of a LAS 1.`minor` header `d`: the legacy 32-bit count,
// or from 1.4 the 64-bit one when set (a set legacy count must agree).
absl::StatusOr<uint64_t> ReadPointCount(const std::string& path, const char* d, int minor) {
  uint64_t count = LoadLE<uint32_t>(d + kLegacyPointCount);
  if (minor >= 4) {
    const uint64_t count64 = LoadLE<uint64_t>(d + kPointCount64);
    if (count64 != 0) {
      if (count != 0 && count != count64) {
        return CorruptFile(path, absl::StrCat("legacy point count ", count,
                                              " disagrees with the 64-bit point count ", count64));
      }
      count = count64;
    }
  }
  return count;
}

// The x, y, z scale factors and offsets of header `d` into *layout:
// CorruptFile when a scale is not finite or 0, or an offset not finite.
absl::Status ReadScaleAndOffset(const std::string& path, const char* d, PointLayout* layout) {
  static constexpr const char* kAxis[3] = {"x", "y", "z"};
  for (int a = 0; a < 3; ++a) {
    layout->scale[a] = LoadLE<double>(d + kScale + 8 * a);
    layout->offset[a] = LoadLE<double>(d + kOffset + 8 * a);
    if (!std::isfinite(layout->scale[a]) || layout->scale[a] == 0) {
      return CorruptFile(path, absl::StrCat("scale factor ", kAxis[a], " = ", layout->scale[a],
                                            " is not a finite non-zero number"));
    }
    if (!std::isfinite(layout->offset[a])) {
      return CorruptFile(path, absl::StrCat("coordinate offset ", kAxis[a], " = ",
                                            layout->offset[a], " is not finite"));
    }
  }
  return absl::OkStatus();
}

// The checked layout of the LAS file `data`: InvalidFile when it is not
// LAS or a version, compression or point format we do not read,
// CorruptFile when its header is inconsistent or the file too short.
absl::StatusOr<PointLayout> ReadHeader(const std::string& path, const std::string& data) {
  const char* d = data.data();
  if (data.compare(0, 4, "LASF") != 0) {
    return InvalidFile(path, "not a LAS file: no 'LASF' magic");
  }
  if (data.size() < kMinHeaderSize) {
    return CorruptFile(path, absl::StrCat("truncated header: the file has ", data.size(),
                                          " bytes, a LAS header at least ", kMinHeaderSize));
  }
  const int major = static_cast<uint8_t>(d[kVersionMajor]);
  const int minor = static_cast<uint8_t>(d[kVersionMinor]);
  if (major != 1 || minor > 4) {
    return InvalidFile(
        path, absl::StrCat("unsupported LAS version ", major, ".", minor, " (supported: 1.0-1.4)"));
  }
  const uint8_t format_byte = static_cast<uint8_t>(d[kPointFormat]);
  // LASzip marks compressed point data by setting bit 7 (and 6) of the
  // format byte.
  if (format_byte & 0xC0) {
    return InvalidFile(
        path, absl::StrCat("compressed LAZ is not supported (point format byte ", format_byte,
                           "); decompress it first, e.g. with laszip or pdal"));
  }
  if (format_byte > 3) {
    return InvalidFile(path, absl::StrCat("point data format ", format_byte,
                                          " is not supported (supported: 0-3)"));
  }
  const int format = format_byte;
  const size_t header_size = LoadLE<uint16_t>(d + kHeaderSize);
  const size_t needed_header = minor >= 4 ? kHeaderSize14 : kMinHeaderSize;
  if (header_size < needed_header) {
    return CorruptFile(path,
                       absl::StrCat("header size ", header_size, " is below the ", needed_header,
                                    " bytes of a LAS ", major, ".", minor, " header"));
  }
  if (header_size > data.size()) {
    return CorruptFile(path, absl::StrCat("truncated header: header size ", header_size,
                                          " but the file has ", data.size(), " bytes"));
  }
  const uint64_t point_offset = LoadLE<uint32_t>(d + kOffsetToPointData);
  if (point_offset < header_size) {
    return CorruptFile(path, absl::StrCat("offset to point data ", point_offset,
                                          " lies inside the ", header_size, "-byte header"));
  }
  const uint64_t record_length = LoadLE<uint16_t>(d + kRecordLength);
  if (record_length < kRecordSize[format]) {
    return CorruptFile(
        path, absl::StrCat("point record length ", record_length, " is shorter than point format ",
                           format, "'s ", kRecordSize[format], " bytes"));
  }
  absl::StatusOr<uint64_t> count = ReadPointCount(path, d, minor);
  if (!count.ok()) return count.status();
  if (!internal::FitsIn(*count, record_length, point_offset, data.size())) {
    const uint64_t room =
        data.size() > point_offset ? (data.size() - point_offset) / record_length : 0;
    return CorruptFile(path, absl::StrCat("truncated: ", *count, " points of ", record_length,
                                          " bytes from offset ", point_offset, " but the file has ",
                                          data.size(), " bytes (room for ", room, ")"));
  }
  PointLayout layout;
  layout.format = format;
  layout.point_offset = point_offset;
  layout.record_length = record_length;
  layout.count = *count;
  absl::Status status = ReadScaleAndOffset(path, d, &layout);
  if (!status.ok()) return status;
  return layout;
}

// Decodes the point records of `d` laid out as `layout`: coordinates into
// the returned xyz (n x 3), classifications into cloud->labels when
// `read_labels`, and rgb (formats 2 and 3) into cloud->features.
std::vector<double> DecodePoints(const char* d, const PointLayout& layout, bool read_labels,
                                 PointCloud* cloud) {
  const size_t n = static_cast<size_t>(layout.count);
  std::vector<double> xyz(3 * n);
  if (read_labels) cloud->labels.resize(n);
  const bool has_rgb = layout.format >= 2;
  if (has_rgb) {
    cloud->feature_channels = 3;
    cloud->features.resize(3 * n);
  }
  const char* record = d + layout.point_offset;
  for (size_t i = 0; i < n; ++i, record += layout.record_length) {
    for (int a = 0; a < 3; ++a) {
      xyz[3 * i + a] = LoadLE<int32_t>(record + 4 * a) * layout.scale[a] + layout.offset[a];
    }
    if (read_labels) cloud->labels[i] = static_cast<uint8_t>(record[kClassification]) & 0x1F;
    if (has_rgb) {
      for (int c = 0; c < 3; ++c) {
        cloud->features[3 * i + c] = static_cast<float>(
            LoadLE<uint16_t>(record + kRgbOffset[layout.format] + 2 * c) / 65535.0);
      }
    }
  }
  return xyz;
}

}  // namespace

absl::StatusOr<PointCloud> ReadLas(const std::string& path, const ReadOptions& options) {
  absl::StatusOr<std::string> file = internal::ReadWholeFile(path, options);
  if (!file.ok()) return file.status();
  absl::StatusOr<PointLayout> layout = ReadHeader(path, *file);
  if (!layout.ok()) return layout.status();
  PointCloud cloud;
  cloud.source = path;
  const bool read_labels = options.label_file.empty();
  const std::vector<double> xyz = DecodePoints(file->data(), *layout, read_labels, &cloud);
  absl::Status status = internal::SetCoordinates(path, xyz, /*recenter=*/true, &cloud);
  if (!status.ok()) return status;
  status = internal::FinishLabels(path, options, &cloud);
  if (!status.ok()) return status;
  return cloud;
}

}  // namespace trainsup::worker
