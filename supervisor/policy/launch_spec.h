// What the daemon starts as one process: the program, its arguments, its
// whole environment, its working directory and its log. Plain data: the
// launch plan (launch_plan.h) builds it, the process adapter
// (supervisor/sys/process.h) starts it.
#ifndef TRAINSUP_SUPERVISOR_POLICY_LAUNCH_SPEC_H_
#define TRAINSUP_SUPERVISOR_POLICY_LAUNCH_SPEC_H_

#include <map>
#include <string>
#include <vector>

namespace trainsup::supervisor {

struct LaunchSpec {
  // A path, or a bare name looked up in the daemon's PATH.
  std::string binary;
  std::vector<std::string> args;  // without argv[0]
  // The child's full environment: nothing is inherited from the daemon.
  std::map<std::string, std::string> env;
  // "" = the daemon's. Checked before the launch; should chdir still fail
  // in the child, it exits with 127.
  std::string working_dir;
  // stdout and stderr are appended here (O_APPEND, created 0640, parent
  // directories created), so a daemon restart never cuts a worker's output.
  // "" = /dev/null.
  std::string log_path;
  // argv[0] when it is not `binary` ("" = `binary`): a command run executes
  // the real path it checked under the name it was given (a venv's python).
  std::string argv0;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_LAUNCH_SPEC_H_
