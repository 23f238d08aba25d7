// TRAINSUP_DATA_ROOTS (the daemon's data roots for its workers): the
// variable's format both ends share, and the one inside-the-roots test.
#include "contracts/data_roots.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/common/temp_dir.h"

namespace trainsup {
namespace {

namespace fs = std::filesystem;

TEST(DataRoots, UnsetEmptyAndListsParse) {
  auto unset = ParseDataRoots(nullptr);
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->has_value());
  auto empty = ParseDataRoots("");
  ASSERT_TRUE(empty.ok());
  ASSERT_TRUE(empty->has_value());
  EXPECT_TRUE((*empty)->empty());  // confined to nothing
  auto two = ParseDataRoots("/data/a::/mnt/b/");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(**two, (std::vector<std::string>{"/data/a", "/mnt/b/"}));
  auto relative = ParseDataRoots("/data:scans");
  EXPECT_EQ(relative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(relative.status().message().find("TRAINSUP_DATA_ROOTS: \"scans\""),
            absl::string_view::npos)
      << relative.status();
}

TEST(DataRoots, FormatRoundTripsAndRefusesWhatCannotBeParsedBack) {
  auto text = FormatDataRoots({"/data/a", "/mnt/b"});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "/data/a:/mnt/b");
  EXPECT_EQ(**ParseDataRoots(text->c_str()), (std::vector<std::string>{"/data/a", "/mnt/b"}));
  EXPECT_EQ(*FormatDataRoots({}), "");
  EXPECT_FALSE(FormatDataRoots({"data"}).ok());
  EXPECT_FALSE(FormatDataRoots({"/data:x"}).ok());
  EXPECT_FALSE(FormatDataRoots({""}).ok());
}

TEST(DataRoots, InsideComparesResolvedComponents) {
  testing::TempDir tmp("data_roots_test");
  const fs::path top(tmp.path());
  fs::create_directories(top / "data" / "scans");
  fs::create_directories(top / "database");
  fs::create_directories(top / "secret");
  std::ofstream(top / "data" / "scans" / "a.ply") << "x";
  std::ofstream(top / "secret" / "key") << "x";
  fs::create_symlink(top / "secret" / "key", top / "data" / "link");
  fs::create_symlink("scans/a.ply", top / "data" / "relative");
  fs::create_directory_symlink(top / "data", top / "alias");
  const std::string data = (top / "data").string();

  EXPECT_TRUE(PathInsideRoots(data, {data}));
  EXPECT_TRUE(PathInsideRoots(data + "/scans/a.ply", {data}));
  EXPECT_TRUE(PathInsideRoots(data + "/scans/a.ply", {data + "/"}));
  EXPECT_TRUE(PathInsideRoots(data + "/not/yet/there", {data}));
  EXPECT_TRUE(PathInsideRoots(data + "/relative", {data}));
  EXPECT_TRUE(PathInsideRoots(data + "/scans/a.ply", {(top / "alias").string()}));
  EXPECT_FALSE(PathInsideRoots((top / "database").string(), {data}));
  EXPECT_FALSE(PathInsideRoots(data + "/link", {data}));
  EXPECT_FALSE(PathInsideRoots(data + "/../secret/key", {data}));
  EXPECT_FALSE(PathInsideRoots(data + "/scans/a.ply", {}));
  EXPECT_TRUE(PathInsideRoots(data + "/link", {data, (top / "secret").string()}));
}

}  // namespace
}  // namespace trainsup
