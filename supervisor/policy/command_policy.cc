#include "supervisor/policy/command_policy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainsup::supervisor {
namespace {

namespace fs = std::filesystem;

constexpr char kField[] = "command.argv[0]: ";

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// The real path, "" when it does not resolve.
std::string RealPath(const std::string& path) {
  std::error_code ec;
  fs::path real = fs::canonical(path, ec);
  return ec ? std::string() : real.string();
}

// Whether `path` is `dir` or below it, comparing whole components.
bool Below(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (p == path.end() || *p != *d) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ResolveProgram(const std::string& argv0) {
  if (argv0.empty()) return absl::InvalidArgumentError(absl::StrCat(kField, "empty"));
  std::string path;
  if (argv0[0] == '/') {
    path = argv0;
  } else if (argv0.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, "\"", argv0,
                     "\" is a relative path; give an absolute path or a program name found in ",
                     kCommandSearchPath));
  } else {
    for (absl::string_view dir : absl::StrSplit(kCommandSearchPath, ':')) {
      const std::string candidate = absl::StrCat(dir, "/", argv0);
      if (IsExecutableFile(candidate)) {
        path = candidate;
        break;
      }
    }
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kField, "\"", argv0, "\" not found in ", kCommandSearchPath));
    }
  }
  if (!IsExecutableFile(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kField, "\"", path, "\" is not an executable file"));
  }
  return path;
}

absl::StatusOr<CheckedProgram> AllowedProgram(const std::string& argv0,
                                              const CommandsSection& commands) {
  if (commands.allowed_programs.empty() && commands.allowed_dirs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField,
        "no program is allowed to run: set commands.allowed_programs or commands.allowed_dirs in "
        "the daemon's configuration"));
  }
  absl::StatusOr<std::string> path = ResolveProgram(argv0);
  if (!path.ok()) return path.status();
  const std::string real = RealPath(*path);
  if (real.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kField, "cannot resolve \"", *path, "\""));
  }
  for (const std::string& allowed : commands.allowed_programs) {
    if (RealPath(allowed) == real) return CheckedProgram{real, *path};
  }
  for (const std::string& dir : commands.allowed_dirs) {
    const std::string real_dir = RealPath(dir);
    if (!real_dir.empty() && Below(real, real_dir)) return CheckedProgram{real, *path};
  }
  std::vector<std::string> allowed = commands.allowed_programs;
  for (const std::string& dir : commands.allowed_dirs) allowed.push_back(dir + "/");
  return absl::InvalidArgumentError(
      absl::StrCat(kField, "\"", *path, "\" (", real,
                   ") is not allowed by the daemon's configuration (commands.allowed_programs and "
                   "commands.allowed_dirs: ",
                   absl::StrJoin(allowed, ", "), ")"));
}

namespace {

bool Listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool LoadsCode(const std::string& name) {
  for (const char* n : kCodeLoadingEnv) {
    if (name == n) return true;
  }
  for (const char* p : kCodeLoadingEnvPrefixes) {
    if (absl::StartsWith(name, p)) return true;
  }
  for (const char* s : kCodeLoadingEnvSuffixes) {
    if (absl::EndsWith(name, s)) return true;
  }
  return false;
}

// Why PATH entry `dir` is refused; "" when it is allowed.
std::string PathEntryRefusal(const std::string& dir, const CommandsSection& commands) {
  if (dir.empty() || dir[0] != '/') return "is not an absolute path";
  const std::string real = RealPath(dir);
  if (real.empty()) return "does not exist";
  if (!fs::is_directory(real)) return "is not a directory";
  for (absl::string_view system : absl::StrSplit(kCommandSearchPath, ':')) {
    if (real == RealPath(std::string(system))) return "";
  }
  for (const std::string& allowed : commands.allowed_dirs) {
    const std::string root = RealPath(allowed);
    if (!root.empty() && Below(real, root)) return "";
  }
  return absl::StrCat("is neither one of ", kCommandSearchPath, " nor below commands.allowed_dirs");
}

}  // namespace

bool EnvNameMatches(const std::vector<std::string>& patterns, const std::string& name) {
  for (const std::string& p : patterns) {
    if (!p.empty() && p.back() == '*') {
      if (absl::StartsWith(name, absl::string_view(p).substr(0, p.size() - 1))) return true;
    } else if (p == name) {
      return true;
    }
  }
  return false;
}

absl::Status CheckCommandEnv(const std::map<std::string, std::string>& env,
                             const CommandsSection& commands) {
  for (const auto& [name, value] : env) {
    if (!commands.env_names.empty() && !EnvNameMatches(commands.env_names, name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "command.env.", name,
          ": not allowed: the daemon's configuration lets command runs set only the variables "
          "of commands.env_names (",
          absl::StrJoin(commands.env_names, ", "), ")"));
    }
    if (Listed(commands.allow_env, name)) continue;
    if (LoadsCode(name) || Listed(commands.deny_env, name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "command.env.", name,
          ": not allowed: it can make the allowed program load other code (allow it with "
          "commands.allow_env in the daemon's configuration)"));
    }
    if (name == "PATH") {
      for (absl::string_view entry : absl::StrSplit(value, ':')) {
        const std::string why = PathEntryRefusal(std::string(entry), commands);
        if (!why.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("command.env.PATH: entry \"", entry, "\" ", why));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace trainsup::supervisor
