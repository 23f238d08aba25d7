// Which program a command run (RunSpec::command) may start: argv[0]
// resolved as the daemon launches it and checked against the daemon's
// [commands] allowlist. At submit (api_service.cc) and again at every launch
// (run_unit.cc), so a reload that removes a program stops its next attempt.
#ifndef TRAINSUP_SUPERVISOR_POLICY_COMMAND_POLICY_H_
#define TRAINSUP_SUPERVISOR_POLICY_COMMAND_POLICY_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "contracts/daemon_config.h"

namespace trainsup::supervisor {

// Where a bare program name is looked up: never the spec's or the daemon's
// PATH, so what is checked is what runs.
inline constexpr char kCommandSearchPath[] = "/usr/local/bin:/usr/bin:/bin";

// The absolute path the daemon executes for `argv0`: an absolute path as it
// is, a bare name (no '/') the first executable regular file of that name in
// kCommandSearchPath. InvalidArgument naming "command.argv[0]" for a
// relative path with a '/', a name not found, or a path that is not an
// executable regular file.
absl::StatusOr<std::string> ResolveProgram(const std::string& argv0);

// A program the allowlist admitted: what to execute and what to call it.
struct CheckedProgram {
  // The real path (symlinks followed) that was checked: the daemon
  // executes this file, never the name again, so a symlink swapped between
  // the check and the exec (in a user-writable venv) runs nothing else.
  std::string exec_path;
  // ResolveProgram's path, passed as argv[0]: a venv's python finds its
  // pyvenv.cfg from argv[0], so it keeps its venv.
  std::string argv0;
};

// ResolveProgram, then the allowlist: the program's real path (symlinks
// followed) must equal the real path of one of `commands.allowed_programs`
// or lie below the real path of one of `commands.allowed_dirs` (whole
// components). OK: the program checked. InvalidArgument naming
// "command.argv[0]" otherwise; with both lists empty, "no program is
// allowed to run: ...".
absl::StatusOr<CheckedProgram> AllowedProgram(const std::string& argv0,
                                              const CommandsSection& commands);

// Variables that make an allowed program load or run other code (a shell's
// startup file, a Python module path or startup script, a loader or
// locale path, an interpreter's options), after the lists sudo's env_reset
// and systemd treat as unsafe; a name is refused when it is one of these
// or starts with one of the prefixes.
inline constexpr const char* kCodeLoadingEnv[] = {
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH", "GLOBIGNORE", "ZDOTDIR",
    "FPATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONWARNINGS", "PYTHONINSPECT",
    "PYTHONUSERBASE", "PYTHONBREAKPOINT", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "PERL5LIB",
    "PERLLIB", "PERL5OPT", "PERL5DB", "PERLIO_DEBUG", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS",
    "NODE_PATH", "LUA_INIT", "LUA_PATH", "LUA_CPATH", "TCLLIBPATH", "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "GCONV_PATH", "LOCPATH", "NLSPATH",
    "GLIBC_TUNABLES", "MALLOC_CHECK_", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "OPENSSL_CONF",
    "OPENSSL_ENGINES", "OPENSSL_MODULES", "SSLKEYLOGFILE", "TERMINFO", "TERMINFO_DIRS", "TERMCAP",
    "GIT_EXEC_PATH", "GIT_CONFIG_GLOBAL", "EDITOR", "VISUAL", "PAGER", "BROWSER",
    // The CUDA driver loads this library into
    // every process that initialises CUDA.
    "CUDA_INJECTION32_PATH", "CUDA_INJECTION64_PATH",
    // NCCL loads a network, tuner, profiler or
    // environment plugin by name or path.
    "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN",
    // Python's user site (~/.local/lib/... and
    // its .pth files) and caches of compiled code
    // that the program imports or runs.
    "HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "PYTHONPYCACHEPREFIX",
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "TORCH_HOME",
    "CUDA_CACHE_PATH", "IPYTHONDIR", "MPLCONFIGDIR"};
inline constexpr const char* kCodeLoadingEnvPrefixes[] = {"LD_", "BASH_FUNC_", "DYLD_", "_RLD"};
// Suffixes of names that load code whatever their prefix (a library's own
// plugin path: NCCL_*_PLUGIN, OMPI_MCA_*_PLUGIN, ...).
inline constexpr const char* kCodeLoadingEnvSuffixes[] = {"_PLUGIN", "_PLUGIN_PATH", "_PLUGIN_DIR"};

// Whether `name` matches one of `patterns`: a name, or a prefix ending in
// '*' ("WANDB_*").
bool EnvNameMatches(const std::vector<std::string>& patterns, const std::string& name);

// The spec's command.env under `commands`: OK, or InvalidArgument naming
// the first variable refused, "command.env.NAME: ...":
// - with commands.env_names set (the allowlist model: docs/configuration.md,
//   "Which variables a command run may set"), a name that matches none of
//   its patterns;
// - a name of kCodeLoadingEnv (or with one of its prefixes or suffixes) or
//   of commands.deny_env, unless commands.allow_env lists it;
// - PATH, unless every entry is an absolute directory whose real path is
//   one of kCommandSearchPath's or lies below one of commands.allowed_dirs
//   (what a wrapper finds by name must be what the allowlist admits).
// At submit and again at every launch, as AllowedProgram.
absl::Status CheckCommandEnv(const std::map<std::string, std::string>& env,
                             const CommandsSection& commands);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_COMMAND_POLICY_H_
