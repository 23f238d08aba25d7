// The Python client's EXIT_CODES are the worker contract's
// (contracts/exit_codes.h): every exit status the contract defines, with its
// reason word, and no other. The client is a separate package that a
// training box installs without the C++ tree, so it keeps its own table;
// this test fails when the two differ.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdio.h>

#include <map>
#include <string>

#include "contracts/exit_codes.h"

namespace trainsup {
namespace {

// `trainsup.EXIT_CODES` of the installed client, as "code=reason" lines.
std::map<int, std::string> PythonExitCodes() {
  FILE* p = popen(
      "env -u PYTHONPATH " TRAINSUP_CLIENT_PYTHON
      " -c 'import trainsup\nfor c, r in sorted(trainsup.EXIT_CODES.items()): print(\"%d=%s\" % "
      "(c, r))'",
      "r");
  std::map<int, std::string> out;
  if (p == nullptr) return out;
  char line[256];
  while (fgets(line, sizeof(line), p) != nullptr) {
    std::string s(line);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    const size_t eq = s.find('=');
    if (eq == std::string::npos) continue;
    out[std::stoi(s.substr(0, eq))] = s.substr(eq + 1);
  }
  EXPECT_EQ(pclose(p), 0);
  return out;
}

TEST(PythonExitCodes, MatchTheWorkerContract) {
  std::map<int, std::string> contract;
  for (int status = 0; status < 256; ++status) {
    if (std::optional<WorkerExit> code = WorkerExitFromStatus(status)) {
      contract[status] = ToString(*code);
    }
  }
  ASSERT_GE(contract.size(), 8u);  // 0, 64, 65, 74, 75, 76, 79, 143 at least
  EXPECT_EQ(PythonExitCodes(), contract);
}

}  // namespace
}  // namespace trainsup
