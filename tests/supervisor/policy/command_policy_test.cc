#include "supervisor/policy/command_policy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

namespace fs = std::filesystem;

std::string Real(const std::string& path) { return fs::canonical(path).string(); }

// An executable script at `path`.
void Executable(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "#!/bin/sh\nexit 0\n";
  fs::permissions(path, fs::perms::owner_all);
}

std::string Message(const absl::StatusOr<std::string>& s) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.status().message());
}

TEST(ResolveProgram, AbsolutePathsAndNamesInTheFixedSearchPath) {
  testing::TempDir dir("command_policy");
  const fs::path tool = fs::path(dir.path()) / "bin" / "tool";
  Executable(tool);
  EXPECT_EQ(ResolveProgram(tool.string()).value(), tool.string());
  // sh is in /usr/bin or /bin on every system this builds on.
  absl::StatusOr<std::string> sh = ResolveProgram("sh");
  ASSERT_TRUE(sh.ok()) << sh.status();
  EXPECT_TRUE(*sh == "/usr/bin/sh" || *sh == "/bin/sh") << *sh;

  EXPECT_EQ(Message(ResolveProgram("bin/tool")),
            "command.argv[0]: \"bin/tool\" is a relative path; give an absolute path or a "
            "program name found in /usr/local/bin:/usr/bin:/bin");
  EXPECT_EQ(Message(ResolveProgram("no-such-program-xyz")),
            "command.argv[0]: \"no-such-program-xyz\" not found in /usr/local/bin:/usr/bin:/bin");
  EXPECT_EQ(Message(ResolveProgram(dir.path())),
            "command.argv[0]: \"" + dir.path() + "\" is not an executable file");
  const fs::path plain = fs::path(dir.path()) / "plain";
  std::ofstream(plain) << "data\n";
  EXPECT_EQ(Message(ResolveProgram(plain.string())),
            "command.argv[0]: \"" + plain.string() + "\" is not an executable file");
}

TEST(AllowedProgram, NothingIsAllowedByDefault) {
  EXPECT_EQ(Message(AllowedProgram("/bin/sh", CommandsSection{})),
            "command.argv[0]: no program is allowed to run: set commands.allowed_programs or "
            "commands.allowed_dirs in the daemon's configuration");
}

TEST(AllowedProgram, ProgramsCompareByRealPath) {
  testing::TempDir dir("command_policy");
  const fs::path python = fs::path(dir.path()) / "usr" / "bin" / "python3.11";
  Executable(python);
  const fs::path link = fs::path(dir.path()) / "usr" / "bin" / "python3";
  fs::create_symlink(python, link);
  const fs::path venv_python = fs::path(dir.path()) / "venv" / "bin" / "python";
  fs::create_directories(venv_python.parent_path());
  fs::create_symlink(link, venv_python);
  const fs::path other = fs::path(dir.path()) / "usr" / "bin" / "perl";
  Executable(other);

  CommandsSection c;
  c.allowed_programs = {link.string()};
  EXPECT_EQ(AllowedProgram(python.string(), c).value(), python.string());
  EXPECT_EQ(AllowedProgram(link.string(), c).value(), link.string());
  // Executed by its own path: a venv's python finds its pyvenv.cfg.
  EXPECT_EQ(AllowedProgram(venv_python.string(), c).value(), venv_python.string());
  const std::string refused = Message(AllowedProgram(other.string(), c));
  EXPECT_EQ(refused.rfind("command.argv[0]: \"" + other.string() + "\" (" + Real(other.string()) +
                              ") is not allowed by the daemon's configuration",
                          0),
            0u)
      << refused;
  EXPECT_NE(refused.find(link.string()), std::string::npos) << refused;

  // A bare name resolves in the fixed search path, then compares by real path.
  CommandsSection sh;
  sh.allowed_programs = {"/bin/sh"};
  absl::StatusOr<std::string> bare = AllowedProgram("sh", sh);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(Real(*bare), Real("/bin/sh"));
  // An allowed program that does not exist allows nothing.
  CommandsSection missing;
  missing.allowed_programs = {(fs::path(dir.path()) / "gone").string()};
  EXPECT_FALSE(AllowedProgram(python.string(), missing).ok());
}

TEST(AllowedProgram, DirectoriesHoldWholeComponents) {
  testing::TempDir dir("command_policy");
  const fs::path tools = fs::path(dir.path()) / "tools";
  Executable(tools / "sub" / "train");
  Executable(fs::path(dir.path()) / "tools2" / "train");
  fs::create_symlink(fs::path(dir.path()) / "tools2" / "train", tools / "escape");
  CommandsSection c;
  c.allowed_dirs = {tools.string()};
  EXPECT_TRUE(AllowedProgram((tools / "sub" / "train").string(), c).ok());
  EXPECT_FALSE(AllowedProgram((fs::path(dir.path()) / "tools2" / "train").string(), c).ok())
      << "a sibling with the directory's name as prefix";
  EXPECT_FALSE(AllowedProgram((tools / "escape").string(), c).ok())
      << "a symlink inside pointing outside";
  EXPECT_FALSE(AllowedProgram((tools / "sub" / ".." / ".." / "tools2" / "train").string(), c).ok());
}

}  // namespace
}  // namespace trainsup::supervisor
