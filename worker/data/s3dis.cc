#include "worker/data/s3dis.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_join.h"
#include "worker/data/reader_util.h"

namespace trainsup::worker {
namespace {

using internal::CorruptFile;
using internal::InvalidFile;

// Points of one text file appended to the running arrays. `label` >= -1
// labels every point (an object file); otherwise the 7th column, when the
// file has one, does.
struct Accumulator {
  std::vector<double> xyz;
  std::vector<float> rgb;
  std::vector<int32_t> labels;
  bool labelled = false;
};

absl::Status ParseText(const std::string& path, bool object_file, int object_label,
                       const ReadOptions& options, Accumulator* out) {
  absl::StatusOr<std::string> text = internal::ReadWholeFile(path, options);
  if (!text.ok()) return text.status();
  internal::TextLines lines(*text);
  std::vector<absl::string_view> tokens;
  size_t columns = 0;
  int first_line = 0;
  double v[7];
  while (lines.Next(&tokens)) {
    if (columns == 0) {
      if (tokens.size() != 6 && (object_file || tokens.size() != 7)) {
        return CorruptFile(
            path, absl::StrCat("line ", lines.line(), ": ", tokens.size(), " values, expected ",
                               object_file ? "6 (x y z r g b)" : "6 or 7 (x y z r g b [label])"));
      }
      columns = tokens.size();
      first_line = lines.line();
    } else if (tokens.size() != columns) {
      return CorruptFile(
          path, absl::StrCat("line ", lines.line(), ": ", tokens.size(), " values, expected ",
                             columns, " like line ", first_line));
    }
    for (size_t c = 0; c < columns; ++c) {
      const absl::string_view t = tokens[c];
      if (!internal::ParseDouble(t.data(), t.data() + t.size(), &v[c])) {
        return CorruptFile(
            path, absl::StrCat("line ", lines.line(), ": '", FileContent(t), "' is not a number"));
      }
    }
    for (int a = 0; a < 3; ++a) {
      if (!std::isfinite(v[a])) {
        return CorruptFile(path, absl::StrCat("line ", lines.line(), ": non-finite coordinate ",
                                              std::string(1, "xyz"[a]), " = ", v[a]));
      }
    }
    for (int c = 3; c < 6; ++c) {
      if (!(v[c] >= 0 && v[c] <= 255)) {
        return CorruptFile(
            path, absl::StrCat("line ", lines.line(), ": colour ", FileContent(absl::StrCat(v[c])),
                               " is outside [0, 255]"));
      }
    }
    if (columns == 7 && !(v[6] >= -1 && v[6] <= INT32_MAX && v[6] == static_cast<int64_t>(v[6]))) {
      return CorruptFile(
          path, absl::StrCat("line ", lines.line(), ": label ", FileContent(absl::StrCat(v[6])),
                             " is not an integer >= -1"));
    }
    out->xyz.insert(out->xyz.end(), v, v + 3);
    for (int c = 3; c < 6; ++c) out->rgb.push_back(static_cast<float>(v[c] / 255.0));
    if (object_file) {
      out->labels.push_back(object_label);
    } else if (columns == 7) {
      out->labels.push_back(static_cast<int32_t>(v[6]));
    }
  }
  out->labelled = object_file || columns == 7;
  return absl::OkStatus();
}

absl::Status ReadAnnotations(const std::string& dir, const ReadOptions& options, Accumulator* out) {
  // Listed through an fd that is checked against the data roots: the
  // folder may be a link.
  absl::StatusOr<std::vector<std::string>> listed = internal::ListFolder(dir, options);
  if (!listed.ok()) return listed.status();
  std::vector<std::string> names;
  for (const std::string& name : *listed) {
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0) names.push_back(name);
  }
  if (names.empty()) return InvalidFile(dir, "no object files (<class>_<n>.txt)");
  for (const std::string& name : names) {
    const std::string file = absl::StrCat(dir, "/", name);
    const std::string stem = name.substr(0, name.size() - 4);
    const size_t underscore = stem.rfind('_');
    if (underscore == std::string::npos || underscore == 0 || underscore + 1 == stem.size() ||
        !std::all_of(stem.begin() + underscore + 1, stem.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      return InvalidFile(file, "object file name is not <class>_<n>.txt");
    }
    absl::StatusOr<int> label = S3disClassIndex(stem.substr(0, underscore));
    if (!label.ok()) {
      return InvalidFile(file, std::string(label.status().message()));
    }
    absl::Status status = ParseText(file, /*object_file=*/true, *label, options, out);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> S3disClassIndex(const std::string& name) {
  for (size_t i = 0; i < kS3disClasses.size(); ++i) {
    if (name == kS3disClasses[i]) return static_cast<int>(i);
  }
  if (name == "stairs") return S3disClassIndex("clutter");
  return absl::InvalidArgumentError(absl::StrCat("unknown S3DIS class '", name,
                                                 "' (known: ", absl::StrJoin(kS3disClasses, ", "),
                                                 "; stairs counts as clutter)"));
}

absl::StatusOr<PointCloud> ReadS3dis(const std::string& path, const ReadOptions& options) {
  Accumulator acc;
  if (internal::IsDirectory(path)) {
    const std::string annotations = absl::StrCat(path, "/Annotations");
    absl::Status status =
        ReadAnnotations(internal::IsDirectory(annotations) ? annotations : path, options, &acc);
    if (!status.ok()) return status;
  } else {
    absl::Status status = ParseText(path, /*object_file=*/false, -1, options, &acc);
    if (!status.ok()) return status;
  }
  PointCloud cloud;
  cloud.source = path;
  absl::Status status = internal::SetCoordinates(path, acc.xyz, /*recenter=*/false, &cloud);
  if (!status.ok()) return status;
  cloud.features = std::move(acc.rgb);
  cloud.feature_channels = 3;
  if (acc.labelled) cloud.labels = std::move(acc.labels);
  status = internal::FinishLabels(path, options, &cloud);
  if (!status.ok()) return status;
  return cloud;
}

}  // namespace trainsup::worker
