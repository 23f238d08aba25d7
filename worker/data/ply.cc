#include "worker/data/ply.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_join.h"
#include "worker/data/reader_util.h"

namespace trainsup::worker {
namespace {

using internal::CorruptFile;
using internal::FitsIn;
using internal::InvalidFile;

// The header is text and short; a file whose first MiB holds no end_header
// is not a PLY file we can read.
constexpr size_t kMaxHeaderBytes = 1 << 20;

enum class Encoding { kAscii, kBinaryLittleEndian, kBinaryBigEndian };

enum class PlyType { kInt8, kUint8, kInt16, kUint16, kInt32, kUint32, kFloat32, kFloat64 };

std::optional<PlyType> ParseType(absl::string_view name) {
  if (name == "char" || name == "int8") return PlyType::kInt8;
  if (name == "uchar" || name == "uint8") return PlyType::kUint8;
  if (name == "short" || name == "int16") return PlyType::kInt16;
  if (name == "ushort" || name == "uint16") return PlyType::kUint16;
  if (name == "int" || name == "int32") return PlyType::kInt32;
  if (name == "uint" || name == "uint32") return PlyType::kUint32;
  if (name == "float" || name == "float32") return PlyType::kFloat32;
  if (name == "double" || name == "float64") return PlyType::kFloat64;
  return std::nullopt;
}

size_t SizeOf(PlyType type) {
  switch (type) {
    case PlyType::kInt8:
    case PlyType::kUint8:
      return 1;
    case PlyType::kInt16:
    case PlyType::kUint16:
      return 2;
    case PlyType::kInt32:
    case PlyType::kUint32:
    case PlyType::kFloat32:
      return 4;
    case PlyType::kFloat64:
      return 8;
  }
  return 0;
}

const char* TypeName(PlyType type) {
  switch (type) {
    case PlyType::kInt8:
      return "char";
    case PlyType::kUint8:
      return "uchar";
    case PlyType::kInt16:
      return "short";
    case PlyType::kUint16:
      return "ushort";
    case PlyType::kInt32:
      return "int";
    case PlyType::kUint32:
      return "uint";
    case PlyType::kFloat32:
      return "float";
    case PlyType::kFloat64:
      return "double";
  }
  return "?";
}

bool IsInteger(PlyType type) { return type != PlyType::kFloat32 && type != PlyType::kFloat64; }

// The range an integer type can hold; ascii values are checked against it.
void IntegerRange(PlyType type, double* lo, double* hi) {
  switch (type) {
    case PlyType::kInt8:
      *lo = -128, *hi = 127;
      return;
    case PlyType::kUint8:
      *lo = 0, *hi = 255;
      return;
    case PlyType::kInt16:
      *lo = -32768, *hi = 32767;
      return;
    case PlyType::kUint16:
      *lo = 0, *hi = 65535;
      return;
    case PlyType::kInt32:
      *lo = -2147483648.0, *hi = 2147483647.0;
      return;
    case PlyType::kUint32:
      *lo = 0, *hi = 4294967295.0;
      return;
    default:
      *lo = -std::numeric_limits<double>::infinity();
      *hi = std::numeric_limits<double>::infinity();
  }
}

double LoadScalar(const char* p, PlyType type, bool big_endian) {
  using internal::Load;
  switch (type) {
    case PlyType::kInt8:
      return static_cast<int8_t>(*p);
    case PlyType::kUint8:
      return static_cast<uint8_t>(*p);
    case PlyType::kInt16:
      return Load<int16_t>(p, big_endian);
    case PlyType::kUint16:
      return Load<uint16_t>(p, big_endian);
    case PlyType::kInt32:
      return Load<int32_t>(p, big_endian);
    case PlyType::kUint32:
      return Load<uint32_t>(p, big_endian);
    case PlyType::kFloat32:
      return Load<float>(p, big_endian);
    case PlyType::kFloat64:
      return Load<double>(p, big_endian);
  }
  return 0;
}

struct Property {
  std::string name;
  PlyType type = PlyType::kFloat32;  // the item type for a list
  bool is_list = false;
  PlyType count_type = PlyType::kUint8;
};

struct Element {
  std::string name;
  uint64_t count = 0;
  std::vector<Property> properties;

  bool HasLists() const {
    for (const Property& p : properties) {
      if (p.is_list) return true;
    }
    return false;
  }
  // Bytes of one binary record, counting a list as its count field alone.
  uint64_t MinRecordBytes() const {
    uint64_t n = 0;
    for (const Property& p : properties) n += SizeOf(p.is_list ? p.count_type : p.type);
    return n;
  }
  int Find(absl::string_view property) const {
    for (size_t i = 0; i < properties.size(); ++i) {
      if (properties[i].name == property) return static_cast<int>(i);
    }
    return -1;
  }
  std::string PropertyNames() const {
    std::vector<std::string> names;
    for (const Property& p : properties) names.push_back(p.name);
    return absl::StrJoin(names, ", ");
  }
};

struct Header {
  Encoding encoding = Encoding::kAscii;
  std::vector<Element> elements;
  size_t body = 0;  // offset of the first byte after end_header's line
};

absl::StatusOr<Header> ParseHeader(const std::string& path, const std::string& data) {
  if (data.compare(0, 4, "ply\n") != 0 && data.compare(0, 5, "ply\r\n") != 0) {
    return InvalidFile(path, "not a PLY file: no 'ply' magic line");
  }
  Header header;
  bool have_format = false;
  const size_t limit = std::min(data.size(), kMaxHeaderBytes);
  size_t pos = data.find('\n') + 1;
  int line = 1;
  std::vector<absl::string_view> tokens;
  while (true) {
    const size_t eol = data.find('\n', pos);
    if (eol == std::string::npos || eol >= limit) {
      return InvalidFile(path, absl::StrCat("no end_header line in the first ",
                                            std::min(data.size(), kMaxHeaderBytes), " bytes"));
    }
    ++line;
    internal::TextLines split(absl::string_view(data.data() + pos, eol - pos));
    const size_t next = eol + 1;
    if (!split.Next(&tokens)) {
      pos = next;
      continue;
    }
    const absl::string_view key = tokens[0];
    if (key == "end_header") {
      header.body = next;
      break;
    }
    if (key == "comment" || key == "obj_info") {
      pos = next;
      continue;
    }
    if (key == "format") {
      if (tokens.size() != 3) {
        return InvalidFile(path, absl::StrCat("header line ", line, ": malformed format line"));
      }
      if (tokens[1] == "ascii") {
        header.encoding = Encoding::kAscii;
      } else if (tokens[1] == "binary_little_endian") {
        header.encoding = Encoding::kBinaryLittleEndian;
      } else if (tokens[1] == "binary_big_endian") {
        header.encoding = Encoding::kBinaryBigEndian;
      } else {
        return InvalidFile(path, absl::StrCat("header line ", line, ": unknown format '",
                                              FileContent(tokens[1]), "'"));
      }
      have_format = true;
    } else if (key == "element") {
      uint64_t count = 0;
      int64_t parsed = 0;
      if (tokens.size() != 3 ||
          !internal::ParseInt64(tokens[2].data(), tokens[2].data() + tokens[2].size(), &parsed) ||
          parsed < 0) {
        return InvalidFile(path, absl::StrCat("header line ", line,
                                              ": malformed element line (element NAME COUNT)"));
      }
      count = static_cast<uint64_t>(parsed);
      header.elements.push_back(Element{std::string(tokens[1]), count, {}});
    } else if (key == "property") {
      if (header.elements.empty()) {
        return InvalidFile(path,
                           absl::StrCat("header line ", line, ": property before any element"));
      }
      Property property;
      if (tokens.size() == 5 && tokens[1] == "list") {
        std::optional<PlyType> count_type = ParseType(tokens[2]);
        std::optional<PlyType> item_type = ParseType(tokens[3]);
        if (!count_type || !item_type) {
          return InvalidFile(path, absl::StrCat("header line ", line, ": unknown property type '",
                                                FileContent(!count_type ? tokens[2] : tokens[3]),
                                                "' for property '", FileContent(tokens[4]), "'"));
        }
        if (!IsInteger(*count_type)) {
          return InvalidFile(path,
                             absl::StrCat("header line ", line, ": list '", FileContent(tokens[4]),
                                          "' has a non-integer count type"));
        }
        property = Property{std::string(tokens[4]), *item_type, true, *count_type};
      } else if (tokens.size() == 3) {
        std::optional<PlyType> type = ParseType(tokens[1]);
        if (!type) {
          return InvalidFile(path, absl::StrCat("header line ", line, ": unknown property type '",
                                                FileContent(tokens[1]), "' for property '",
                                                FileContent(tokens[2]), "'"));
        }
        property = Property{std::string(tokens[2]), *type, false, PlyType::kUint8};
      } else {
        return InvalidFile(path, absl::StrCat("header line ", line, ": malformed property line"));
      }
      header.elements.back().properties.push_back(std::move(property));
    } else {
      return InvalidFile(
          path, absl::StrCat("header line ", line, ": unexpected '", FileContent(key), "'"));
    }
    pos = next;
  }
  if (!have_format) return InvalidFile(path, "header has no format line");
  return header;
}

// Which vertex properties the reader wants, by index into the element's
// properties (-1: absent).
struct Selection {
  int xyz[3] = {-1, -1, -1};
  int rgb[3] = {-1, -1, -1};
  int label = -1;
  bool has_rgb() const { return rgb[0] >= 0; }
};

absl::StatusOr<Selection> Select(const std::string& path, const Element& vertex,
                                 const ReadOptions& options) {
  Selection s;
  static constexpr const char* kXyz[3] = {"x", "y", "z"};
  static constexpr const char* kRgb[3] = {"red", "green", "blue"};
  for (int a = 0; a < 3; ++a) {
    s.xyz[a] = vertex.Find(kXyz[a]);
    if (s.xyz[a] < 0) {
      return InvalidFile(
          path, absl::StrCat("vertex element has no '", kXyz[a],
                             "' property (it has: ", FileContent(vertex.PropertyNames()), ")"));
    }
    if (vertex.properties[s.xyz[a]].is_list) {
      return InvalidFile(path, absl::StrCat("vertex property '", kXyz[a], "' is a list"));
    }
  }
  bool all_rgb = true;
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = vertex.Find(kRgb[c]);
    all_rgb = all_rgb && rgb[c] >= 0 && !vertex.properties[rgb[c]].is_list;
  }
  if (all_rgb) {
    for (int c = 0; c < 3; ++c) {
      const PlyType t = vertex.properties[rgb[c]].type;
      if (t != PlyType::kUint8 && t != PlyType::kUint16 && t != PlyType::kFloat32 &&
          t != PlyType::kFloat64) {
        return InvalidFile(path,
                           absl::StrCat("colour property '", kRgb[c], "' has type ", TypeName(t),
                                        "; expected uchar, ushort, float or double"));
      }
      s.rgb[c] = rgb[c];
    }
  }
  if (!options.label_file.empty()) return s;  // the side file replaces any label property
  if (!options.label_property.empty()) {
    s.label = vertex.Find(options.label_property);
    if (s.label < 0) {
      return InvalidFile(
          path, absl::StrCat("vertex element has no label property '", options.label_property,
                             "' (it has: ", FileContent(vertex.PropertyNames()), ")"));
    }
  } else {
    for (const char* name : kDefaultPlyLabelProperties) {
      s.label = vertex.Find(name);
      if (s.label >= 0) break;
    }
  }
  if (s.label >= 0 && vertex.properties[s.label].is_list) {
    return InvalidFile(
        path, absl::StrCat("label property '", FileContent(vertex.properties[s.label].name),
                           "' is a list"));
  }
  return s;
}

// Collects the selected values of one vertex into the output arrays.
class VertexSink {
 public:
  VertexSink(const std::string& path, const Element& vertex, const Selection& selection)
      : path_(path), vertex_(vertex), s_(selection) {
    const size_t n = static_cast<size_t>(vertex.count);
    xyz_.resize(3 * n);
    if (s_.has_rgb()) rgb_.resize(3 * n);
    if (s_.label >= 0) labels_.resize(n);
    for (size_t p = 0; p < vertex.properties.size(); ++p)
      role_.push_back(Role(static_cast<int>(p)));
  }

  // What property p is for: 0-2 x y z, 3-5 red green blue, 6 label, -1 none.
  int role(size_t p) const { return role_[p]; }

  // Stores value v of property p for vertex i. ascii values are checked
  // against their declared type here; binary ones hold by construction.
  absl::Status Put(size_t i, size_t p, double v, bool check_type) {
    const Property& prop = vertex_.properties[p];
    if (check_type && IsInteger(prop.type)) {
      double lo, hi;
      IntegerRange(prop.type, &lo, &hi);
      if (!(v >= lo && v <= hi) || v != std::floor(v)) {
        return CorruptFile(
            path_, absl::StrCat("value ", FileContent(absl::StrCat(v)), " of ", TypeName(prop.type),
                                " property '", FileContent(prop.name), "' at vertex ", i,
                                " does not fit its type"));
      }
    }
    const int r = role_[p];
    if (r < 3) {
      xyz_[3 * i + r] = v;
    } else if (r < 6) {
      if (prop.type == PlyType::kUint8) v /= 255.0;
      if (prop.type == PlyType::kUint16) v /= 65535.0;
      rgb_[3 * i + (r - 3)] = static_cast<float>(v);
    } else {
      if (!(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()) ||
          v != std::floor(v)) {
        return CorruptFile(path_, absl::StrCat("label property '", FileContent(prop.name),
                                               "' = ", FileContent(absl::StrCat(v)), " at vertex ",
                                               i, " is not a 32-bit integer"));
      }
      labels_[i] = static_cast<int32_t>(v);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<PointCloud> Finish() {
    PointCloud cloud;
    bool recenter = false;
    for (int a = 0; a < 3; ++a) {
      recenter = recenter || vertex_.properties[s_.xyz[a]].type == PlyType::kFloat64;
    }
    absl::Status status = internal::SetCoordinates(path_, xyz_, recenter, &cloud);
    if (!status.ok()) return status;
    if (s_.has_rgb()) {
      cloud.features = std::move(rgb_);
      cloud.feature_channels = 3;
    }
    cloud.labels = std::move(labels_);
    return cloud;
  }

 private:
  int Role(int p) const {
    for (int a = 0; a < 3; ++a) {
      if (s_.xyz[a] == p) return a;
      if (s_.rgb[a] == p) return 3 + a;
    }
    return s_.label == p ? 6 : -1;
  }

  const std::string& path_;
  const Element& vertex_;
  const Selection& s_;
  std::vector<int> role_;
  std::vector<double> xyz_;
  std::vector<float> rgb_;
  std::vector<int32_t> labels_;
};

// Binary bodies. `pos` is the offset of the element's first record and
// advances past the element.
class BinaryBody {
 public:
  BinaryBody(const std::string& path, const std::string& data, bool big_endian)
      : path_(path), data_(data), big_endian_(big_endian) {}

  // Checks that `element.count` records of at least their minimum size fit
  // in the rest of the file. Done before anything is allocated or looped
  // over, so a lying count costs nothing.
  absl::Status CheckCount(const Element& element, size_t pos) const {
    const uint64_t min_bytes = element.MinRecordBytes();
    if (!FitsIn(element.count, min_bytes, pos, data_.size())) {
      return CorruptFile(
          path_, absl::StrCat("truncated: element '", FileContent(element.name), "' has ",
                              element.count, " records of at least ", min_bytes,
                              " bytes, but only ", data_.size() - pos, " bytes follow the header"));
    }
    return absl::OkStatus();
  }

  absl::Status Skip(const Element& element, size_t* pos) const {
    absl::Status status = CheckCount(element, *pos);
    if (!status.ok()) return status;
    if (!element.HasLists()) {
      *pos += static_cast<size_t>(element.count * element.MinRecordBytes());
      return absl::OkStatus();
    }
    for (uint64_t i = 0; i < element.count; ++i) {
      for (const Property& p : element.properties) {
        status = Advance(element, i, p, pos);
        if (!status.ok()) return status;
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadVertices(const Element& vertex, VertexSink* sink, size_t* pos) const {
    const size_t n = static_cast<size_t>(vertex.count);
    const char* base = data_.data();
    if (!vertex.HasLists()) {
      // Packed records: fixed offsets, one memcpy per wanted value.
      std::vector<size_t> offset(vertex.properties.size());
      size_t stride = 0;
      for (size_t p = 0; p < vertex.properties.size(); ++p) {
        offset[p] = stride;
        stride += SizeOf(vertex.properties[p].type);
      }
      std::vector<size_t> wanted;
      for (size_t p = 0; p < vertex.properties.size(); ++p) {
        if (sink->role(p) >= 0) wanted.push_back(p);
      }
      for (size_t i = 0; i < n; ++i) {
        const char* record = base + *pos + i * stride;
        for (size_t p : wanted) {
          absl::Status status = sink->Put(
              i, p, LoadScalar(record + offset[p], vertex.properties[p].type, big_endian_),
              /*check_type=*/false);
          if (!status.ok()) return status;
        }
      }
      *pos += n * stride;
      return absl::OkStatus();
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t p = 0; p < vertex.properties.size(); ++p) {
        const Property& prop = vertex.properties[p];
        const size_t at = *pos;
        absl::Status status = Advance(vertex, i, prop, pos);
        if (!status.ok()) return status;
        if (sink->role(p) >= 0) {
          status = sink->Put(i, p, LoadScalar(base + at, prop.type, big_endian_), false);
          if (!status.ok()) return status;
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  // Moves *pos past property p of record i, checking the file's end.
  absl::Status Advance(const Element& element, uint64_t i, const Property& p, size_t* pos) const {
    uint64_t bytes = SizeOf(p.is_list ? p.count_type : p.type);
    if (p.is_list) {
      if (!FitsIn(1, bytes, *pos, data_.size())) return Truncated(element, i);
      const double items = LoadScalar(data_.data() + *pos, p.count_type, big_endian_);
      if (items < 0) {
        return CorruptFile(
            path_, absl::StrCat("list '", FileContent(p.name), "' of ", FileContent(element.name),
                                " ", i, " has a negative length"));
      }
      *pos += bytes;
      bytes = static_cast<uint64_t>(items) * SizeOf(p.type);
    }
    if (!FitsIn(1, bytes, *pos, data_.size())) return Truncated(element, i);
    *pos += static_cast<size_t>(bytes);
    return absl::OkStatus();
  }

  absl::Status Truncated(const Element& element, uint64_t i) const {
    return CorruptFile(
        path_, absl::StrCat("truncated: ", FileContent(element.name), " ", i, " of ", element.count,
                            " runs past the end of the file (", data_.size(), " bytes)"));
  }

  const std::string& path_;
  const std::string& data_;
  bool big_endian_;
};

// Ascii bodies: a stream of whitespace-separated tokens (one record per line
// by convention; the reader does not rely on it).
class AsciiBody {
 public:
  AsciiBody(const std::string& path, const std::string& data, size_t pos)
      : path_(path), p_(data.data() + pos), end_(data.data() + data.size()) {}

  // Each value takes a character and a separator (the last one may go
  // without), so `count` records of k scalar values need 2·count·k − 1
  // bytes. Checked before anything is allocated or looped over.
  absl::Status CheckCount(const Element& element) const {
    const uint64_t values = element.properties.size();
    const uint64_t left = static_cast<uint64_t>(end_ - p_);
    if (element.count > 0 && values > 0 && !FitsIn(element.count, 2 * values, 0, left + 1)) {
      return CorruptFile(path_, absl::StrCat("truncated: element '", FileContent(element.name),
                                             "' has ", element.count, " records of ", values,
                                             " values, but only ", left, " bytes follow"));
    }
    return absl::OkStatus();
  }

  absl::Status Skip(const Element& element) {
    absl::Status status = CheckCount(element);
    if (!status.ok() || element.properties.empty()) return status;
    for (uint64_t i = 0; i < element.count; ++i) {
      for (const Property& p : element.properties) {
        absl::StatusOr<uint64_t> items = ListLength(element, i, p);
        if (!items.ok()) return items.status();
        for (uint64_t k = 0; k < *items; ++k) {
          if (!NextToken()) return Truncated(element, i);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadVertices(const Element& vertex, VertexSink* sink) {
    for (uint64_t i = 0; i < vertex.count; ++i) {
      for (size_t p = 0; p < vertex.properties.size(); ++p) {
        const Property& prop = vertex.properties[p];
        absl::StatusOr<uint64_t> items = ListLength(vertex, i, prop);
        if (!items.ok()) return items.status();
        for (uint64_t k = 0; k < *items; ++k) {
          if (!NextToken()) return Truncated(vertex, i);
        }
        if (sink->role(p) < 0) continue;
        double v = 0;
        if (!internal::ParseDouble(token_.data(), token_.data() + token_.size(), &v)) {
          return NotANumber(vertex, i, prop);
        }
        absl::Status status = sink->Put(static_cast<size_t>(i), p, v, /*check_type=*/true);
        if (!status.ok()) return status;
      }
    }
    return absl::OkStatus();
  }

 private:
  // 1 for a scalar; for a list, reads its length token.
  absl::StatusOr<uint64_t> ListLength(const Element& element, uint64_t i, const Property& p) {
    if (!p.is_list) return 1;
    if (!NextToken()) return Truncated(element, i);
    int64_t items = 0;
    if (!internal::ParseInt64(token_.data(), token_.data() + token_.size(), &items) || items < 0) {
      return CorruptFile(path_, absl::StrCat("line ", line_, ": list length '", FileContent(token_),
                                             "' of '", FileContent(p.name), "' is not a count"));
    }
    return static_cast<uint64_t>(items);
  }

  bool NextToken() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\r' || *p_ == '\n')) {
      if (*p_ == '\n') ++line_;
      ++p_;
    }
    const char* start = p_;
    while (p_ < end_ && *p_ != ' ' && *p_ != '\t' && *p_ != '\r' && *p_ != '\n') ++p_;
    token_ = absl::string_view(start, static_cast<size_t>(p_ - start));
    return p_ > start;
  }

  absl::Status Truncated(const Element& element, uint64_t i) const {
    return CorruptFile(path_, absl::StrCat("truncated: ", FileContent(element.name), " ", i, " of ",
                                           element.count, " ends early (body line ", line_, ")"));
  }

  absl::Status NotANumber(const Element& element, uint64_t i, const Property& p) const {
    return CorruptFile(path_, absl::StrCat("body line ", line_, ": '", FileContent(token_),
                                           "' is not a number (property '", FileContent(p.name),
                                           "' of ", FileContent(element.name), " ", i, ")"));
  }

  const std::string& path_;
  const char* p_;
  const char* end_;
  int line_ = 1;
  absl::string_view token_;
};

}  // namespace

absl::StatusOr<PointCloud> ReadPly(const std::string& path, const ReadOptions& options) {
  absl::StatusOr<std::string> data = internal::ReadWholeFile(path, options);
  if (!data.ok()) return data.status();
  absl::StatusOr<Header> header = ParseHeader(path, *data);
  if (!header.ok()) return header.status();

  int vertex_index = -1;
  for (size_t e = 0; e < header->elements.size(); ++e) {
    if (header->elements[e].name == "vertex") {
      vertex_index = static_cast<int>(e);
      break;
    }
  }
  if (vertex_index < 0) return InvalidFile(path, "no 'vertex' element");
  const Element& vertex = header->elements[vertex_index];
  absl::StatusOr<Selection> selection = Select(path, vertex, options);
  if (!selection.ok()) return selection.status();

  absl::StatusOr<PointCloud> cloud;
  if (header->encoding == Encoding::kAscii) {
    AsciiBody body(path, *data, header->body);
    for (int e = 0; e < vertex_index; ++e) {
      absl::Status status = body.Skip(header->elements[e]);
      if (!status.ok()) return status;
    }
    absl::Status status = body.CheckCount(vertex);
    if (!status.ok()) return status;
    VertexSink sink(path, vertex, *selection);
    status = body.ReadVertices(vertex, &sink);
    if (!status.ok()) return status;
    cloud = sink.Finish();
  } else {
    BinaryBody body(path, *data, header->encoding == Encoding::kBinaryBigEndian);
    size_t pos = header->body;
    for (int e = 0; e < vertex_index; ++e) {
      absl::Status status = body.Skip(header->elements[e], &pos);
      if (!status.ok()) return status;
    }
    absl::Status status = body.CheckCount(vertex, pos);
    if (!status.ok()) return status;
    VertexSink sink(path, vertex, *selection);
    status = body.ReadVertices(vertex, &sink, &pos);
    if (!status.ok()) return status;
    cloud = sink.Finish();
  }
  if (!cloud.ok()) return cloud.status();
  cloud->source = path;
  absl::Status status = internal::CheckFeatures(path, *cloud);
  if (!status.ok()) return status;
  status = internal::FinishLabels(path, options, &*cloud);
  if (!status.ok()) return status;
  return cloud;
}

}  // namespace trainsup::worker
