// Test-side half of tests/common/fault_open_shim.cc: a failing open to
// inject into a process, and the environment that makes the shim do it.
#ifndef TRAINSUP_TESTS_COMMON_FAULT_OPEN_H_
#define TRAINSUP_TESTS_COMMON_FAULT_OPEN_H_

#include <string>
#include <utility>
#include <vector>

namespace trainsup::testing {

// Opens of a checkpoint file that fail while a worker resumes.
struct OpenFault {
  const char* errno_name;  // EIO, EMFILE, ENOMEM, ...
  const char* file;        // under the run's checkpoints/
  const char* skip;        // matching opens that succeed first
  const char* resume;      // the worker's --resume
};

// NAME, VALUE pairs for the process's environment: the shim at `shim`
// preloaded, failing opens of `path` as `fault` says.
inline std::vector<std::pair<std::string, std::string>> FaultOpenEnv(const std::string& shim,
                                                                     const std::string& path,
                                                                     const OpenFault& fault) {
  return {{"LD_PRELOAD", shim},
          {"TRAINSUP_FAULT_OPEN_PATH", path},
          {"TRAINSUP_FAULT_OPEN_ERRNO", fault.errno_name},
          {"TRAINSUP_FAULT_OPEN_SKIP", fault.skip}};
}

}  // namespace trainsup::testing

#endif  // TRAINSUP_TESTS_COMMON_FAULT_OPEN_H_
