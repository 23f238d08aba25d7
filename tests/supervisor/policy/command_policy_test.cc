#include "supervisor/policy/command_policy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
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

template <class T>
std::string Message(const absl::StatusOr<T>& s) {
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
  EXPECT_EQ(AllowedProgram(python.string(), c).value().exec_path, Real(python.string()));
  EXPECT_EQ(AllowedProgram(link.string(), c).value().argv0, link.string());
  // Issue 42, 8: what runs is the file that was checked (the real path),
  // never the name again; argv[0] is the name, so a venv's python finds
  // its pyvenv.cfg.
  EXPECT_EQ(AllowedProgram(link.string(), c).value().exec_path, Real(python.string()));
  EXPECT_EQ(AllowedProgram(venv_python.string(), c).value().exec_path, Real(python.string()));
  EXPECT_EQ(AllowedProgram(venv_python.string(), c).value().argv0, venv_python.string());
  // The venv's link swapped for another program after the check: the
  // checked path still names the allowed file.
  const CheckedProgram checked = AllowedProgram(venv_python.string(), c).value();
  fs::remove(venv_python);
  fs::create_symlink(other, venv_python);
  EXPECT_EQ(checked.exec_path, Real(python.string()));
  EXPECT_FALSE(AllowedProgram(venv_python.string(), c).ok());
  fs::remove(venv_python);
  fs::create_symlink(link, venv_python);
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
  absl::StatusOr<CheckedProgram> bare = AllowedProgram("sh", sh);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->exec_path, Real("/bin/sh"));
  EXPECT_EQ(Real(bare->argv0), Real("/bin/sh"));
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

std::string EnvRefusal(const std::map<std::string, std::string>& env,
                       const CommandsSection& commands) {
  absl::Status s = CheckCommandEnv(env, commands);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  return std::string(s.message());
}

// The allowlist admits a program, not code loaded into it: variables that
// make an interpreter or a shell wrapper run other code are refused,
// unless the daemon's configuration allows them by name.
TEST(CheckCommandEnv, VariablesThatLoadCodeAreRefusedUnlessAllowed) {
  CommandsSection commands;
  EXPECT_TRUE(CheckCommandEnv({{"OMP_NUM_THREADS", "4"}, {"MY_SETTING", "x"}}, commands).ok());
  for (const char* name :
       {"BASH_ENV", "ENV", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONWARNINGS", "GCONV_PATH",
        "PERL5OPT", "NODE_OPTIONS", "GLIBC_TUNABLES", "LD_BIND_NOW", "BASH_FUNC_ls%%"}) {
    EXPECT_EQ(EnvRefusal({{name, "/tmp/evil"}}, commands),
              std::string("command.env.") + name +
                  ": not allowed: it can make the allowed program load other code (allow it "
                  "with commands.allow_env in the daemon's configuration)")
        << name;
  }
  commands.allow_env = {"PYTHONPATH"};
  EXPECT_TRUE(CheckCommandEnv({{"PYTHONPATH", "/opt/lib"}}, commands).ok());
  EXPECT_FALSE(CheckCommandEnv({{"PYTHONSTARTUP", "/opt/x.py"}}, commands).ok());
  commands.deny_env = {"MY_PLUGIN_DIR"};
  EXPECT_NE(EnvRefusal({{"MY_PLUGIN_DIR", "/x"}}, commands).find("command.env.MY_PLUGIN_DIR"),
            std::string::npos);
}

// Issue 42, 7: more variables that load code into an allowed program: the
// CUDA driver's injection library, NCCL's plugins, the home directory (and
// with it Python's user site and its .pth files), caches of compiled code.
TEST(CheckCommandEnv, CudaNcclHomeAndCompiledCachesAreRefused) {
  CommandsSection commands;
  for (const char* name :
       {"CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN",
        "NCCL_NET", "HOME", "PYTHONPYCACHEPREFIX", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
        "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "OMPI_MCA_BTL_PLUGIN", "SOME_LIB_PLUGIN_PATH"}) {
    EXPECT_FALSE(CheckCommandEnv({{name, "/tmp/evil"}}, commands).ok()) << name;
  }
  EXPECT_TRUE(CheckCommandEnv({{"NCCL_DEBUG", "INFO"}}, commands).ok());
}

// The allowlist model: with commands.env_names set, only matching names
// pass, and the built-in list still holds for them.
TEST(CheckCommandEnv, WithEnvNamesOnlyTheListedNamesPass) {
  CommandsSection commands;
  commands.env_names = {"OMP_NUM_THREADS", "WANDB_*", "PYTHONPATH"};
  EXPECT_TRUE(CheckCommandEnv({{"OMP_NUM_THREADS", "4"}, {"WANDB_API_KEY", "k"}}, commands).ok());
  EXPECT_EQ(EnvRefusal({{"MY_SETTING", "x"}}, commands),
            "command.env.MY_SETTING: not allowed: the daemon's configuration lets command runs "
            "set only the variables of commands.env_names (OMP_NUM_THREADS, WANDB_*, PYTHONPATH)");
  EXPECT_FALSE(CheckCommandEnv({{"WANDB", "x"}}, commands).ok()) << "a prefix, not a name";
  EXPECT_NE(EnvRefusal({{"PYTHONPATH", "/opt"}}, commands).find("load other code"),
            std::string::npos);
  commands.allow_env = {"PYTHONPATH"};
  EXPECT_TRUE(CheckCommandEnv({{"PYTHONPATH", "/opt"}}, commands).ok());
  EXPECT_TRUE(EnvNameMatches({"A_*"}, "A_"));
  EXPECT_FALSE(EnvNameMatches({"A_*"}, "B_A"));
}

// PATH decides what a wrapper finds by name: only the fixed search path's
// directories and those below commands.allowed_dirs.
TEST(CheckCommandEnv, PathHoldsOnlyDirectoriesTheAllowlistTrusts) {
  testing::TempDir dir("command_env_path");
  const fs::path tools = fs::path(dir.path()) / "tools";
  const fs::path other = fs::path(dir.path()) / "other";
  fs::create_directories(tools / "bin");
  fs::create_directories(other);
  fs::create_symlink(other, fs::path(dir.path()) / "tools" / "escape");
  CommandsSection commands;
  commands.allowed_dirs = {tools.string()};
  EXPECT_TRUE(CheckCommandEnv({{"PATH", "/usr/bin:/bin"}}, commands).ok());
  EXPECT_TRUE(CheckCommandEnv({{"PATH", (tools / "bin").string() + ":/usr/bin"}}, commands).ok());
  EXPECT_EQ(EnvRefusal({{"PATH", "/usr/bin:" + other.string()}}, commands),
            "command.env.PATH: entry \"" + other.string() +
                "\" is neither one of /usr/local/bin:/usr/bin:/bin nor below "
                "commands.allowed_dirs");
  // A symlink inside an allowed directory is judged by where it leads.
  EXPECT_FALSE(CheckCommandEnv({{"PATH", (tools / "escape").string()}}, commands).ok());
  EXPECT_NE(EnvRefusal({{"PATH", "bin:/usr/bin"}}, commands).find("\"bin\" is not an absolute"),
            std::string::npos);
  EXPECT_NE(EnvRefusal({{"PATH", "/usr/bin::/bin"}}, commands).find("\"\" is not an absolute"),
            std::string::npos);
  EXPECT_NE(EnvRefusal({{"PATH", "/no/such/dir"}}, commands).find("does not exist"),
            std::string::npos);
  commands.allow_env = {"PATH"};
  EXPECT_TRUE(CheckCommandEnv({{"PATH", other.string()}}, commands).ok());
}

}  // namespace
}  // namespace trainsup::supervisor
