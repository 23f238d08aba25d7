// Which program a command run (RunSpec::command) may start: argv[0]
// resolved as the daemon launches it and checked against the daemon's
// [commands] allowlist. At submit (api_service.cc) and again at every launch
// (run_unit.cc), so a reload that removes a program stops its next attempt.
#ifndef TRAINSUP_SUPERVISOR_POLICY_COMMAND_POLICY_H_
#define TRAINSUP_SUPERVISOR_POLICY_COMMAND_POLICY_H_

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

// ResolveProgram, then the allowlist: the program's real path (symlinks
// followed) must equal the real path of one of `commands.allowed_programs`
// or lie below the real path of one of `commands.allowed_dirs` (whole
// components). OK: the path to execute (ResolveProgram's, so a venv's
// python keeps its own path). InvalidArgument naming "command.argv[0]"
// otherwise; with both lists empty, "no program is allowed to run: ...".
absl::StatusOr<std::string> AllowedProgram(const std::string& argv0,
                                           const CommandsSection& commands);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_COMMAND_POLICY_H_
