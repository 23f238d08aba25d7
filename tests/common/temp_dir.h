// A fresh directory under the system's temporary directory, removed with
// everything in it when the object goes away. For tests.
#ifndef TRAINSUP_TESTS_COMMON_TEMP_DIR_H_
#define TRAINSUP_TESTS_COMMON_TEMP_DIR_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace trainsup::testing {

class TempDir {
 public:
  // `prefix` names the directory (prefix.XXXXXX) so a leftover says whose.
  explicit TempDir(const std::string& prefix = "trainsup_test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace trainsup::testing

#endif  // TRAINSUP_TESTS_COMMON_TEMP_DIR_H_
