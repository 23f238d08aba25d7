#include "contracts/data_roots.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainsup {

absl::StatusOr<std::string> FormatDataRoots(const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    if (root.empty() || root[0] != '/' || root.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(kDataRootsEnv, ": data root \"", root,
                                                     "\" is not an absolute path without ':'"));
    }
  }
  return absl::StrJoin(roots, ":");
}

absl::StatusOr<std::optional<std::vector<std::string>>> ParseDataRoots(const char* value) {
  if (value == nullptr) return std::optional<std::vector<std::string>>();
  std::vector<std::string> roots;
  for (absl::string_view entry : absl::StrSplit(value, ':', absl::SkipEmpty())) {
    if (entry[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat(kDataRootsEnv, ": \"", entry, "\" is not an absolute path"));
    }
    roots.emplace_back(entry);
  }
  return std::optional<std::vector<std::string>>(std::move(roots));
}

bool PathInsideRoots(const std::string& path, const std::vector<std::string>& roots) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::path(path), ec);
  if (ec || !resolved.is_absolute()) return false;
  for (const std::string& root : roots) {
    const fs::path r = fs::weakly_canonical(fs::path(root), ec);
    if (ec || !r.is_absolute()) continue;
    // Component-wise prefix; a trailing '/' of the root is an empty last
    // component, which matches nothing, so it is dropped.
    auto r_end = r.end();
    if (r_end != r.begin() && std::prev(r_end)->empty()) --r_end;
    auto [root_end, _] = std::mismatch(r.begin(), r_end, resolved.begin(), resolved.end());
    if (root_end == r_end) return true;
  }
  return false;
}

}  // namespace trainsup
