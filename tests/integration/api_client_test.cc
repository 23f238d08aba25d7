// The dashboard example of docs/api.md (docs/examples/dashboard_client.py),
// run by Debian's Python against the real daemon with the viewer token:
// what a dashboard author copies must work.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

using ::testing::HasSubstr;

TEST(ApiClient, ThePythonDashboardExampleReadsNodeRunsAndEvents) {
#ifndef TRAINSUP_CLIENT_PYTHON
  GTEST_SKIP() << "the Python client is not built (python/CMakeLists.txt; deploy/bootstrap.sh)";
#else
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  const std::string id = h.Submit(Spec("dash", 6, 20, 3));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(h.WaitForState(id, v1::RUN_STATE_SUCCEEDED, kRunLimit));

  auto client = [&](const std::vector<std::string>& args, const std::string& token_file) {
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "-u",
                                     "PYTHONPATH",
                                     TRAINSUP_CLIENT_PYTHON,
                                     TRAINSUP_DASHBOARD_CLIENT,
                                     "--target",
                                     "unix:" + h.socket_path(),
                                     "--token-file",
                                     token_file};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, Seconds(30), h.dir() + "/client-" + args[0]);
  };

  CommandResult node = client({"node"}, h.viewer_token_path());
  EXPECT_EQ(node.code, 0) << node.err;
  v1::Node expected;
  auto ctx = h.Context(h.viewer_token());
  ASSERT_TRUE(h.stub().GetNode(ctx.get(), v1::GetNodeRequest(), &expected).ok());
  EXPECT_THAT(node.out, HasSubstr("version " + expected.version() + " slots " +
                                  std::to_string(expected.slots_size())));

  CommandResult list = client({"list"}, h.viewer_token_path());
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr(id + " RUN_STATE_SUCCEEDED step 6/6"));

  CommandResult describe = client({"describe", id}, h.viewer_token_path());
  EXPECT_EQ(describe.code, 0) << describe.err;
  EXPECT_THAT(describe.out, HasSubstr("attempt 1 EXIT_CLASS_SUCCESS"));
  EXPECT_THAT(describe.out, HasSubstr("checkpoint step 6"));

  // The whole history, from event 1, ending with the final state; the
  // stream ends by itself because the run has ended.
  CommandResult watch = client({"watch", id}, h.viewer_token_path());
  EXPECT_EQ(watch.code, 0) << watch.err;
  EXPECT_EQ(watch.out.rfind("1 ", 0), 0u) << watch.out;
  EXPECT_THAT(watch.out, HasSubstr("EVENT_KIND_STATE RUN_STATE_SUCCEEDED"));

  // A wrong token gets the daemon's refusal, named, and exit 1.
  const std::string bad = h.dir() + "/bad.token";
  WriteFileText(bad, "not-a-token\n");
  CommandResult refused = client({"list"}, bad);
  EXPECT_EQ(refused.code, 1);
  EXPECT_THAT(refused.err, HasSubstr("UNAUTHENTICATED"));
#endif
}

}  // namespace
}  // namespace trainsup::integration
