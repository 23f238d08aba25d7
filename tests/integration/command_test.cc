// The real trainsupd running command runs ([command] in the spec) of
// /bin/sh: supervised by exit code alone (heartbeats = false), restarted
// like a crash, and refused at submit when the daemon's [commands]
// configuration does not allow the program. Python scripts with the
// client are the end-to-end tests of the Python package.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/integration/daemon_harness.h"
#include "tests/integration/daemon_test_util.h"

namespace trainsup::integration {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A command run of `/bin/sh -c SCRIPT`; `script` must not contain '"' or '\'.
std::string ShellSpec(const std::string& name, const std::string& script) {
  return "name = \"" + name + "\"\n[command]\nargv = [\"/bin/sh\", \"-c\", \"" + script + "\"]\n";
}

TEST(CommandRun, ExitZeroWithoutHeartbeatsSucceedsAndTheOutputIsInTheRankLog) {
  DaemonHarness h;
  h.Set("commands.allowed_programs", "[\"/bin/sh\"]");
  ASSERT_TRUE(h.Start());
  const std::string id =
      h.Submit(ShellSpec("hi",
                         "echo hi; echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_WORLD_SIZE "
                         "attempt=$TRAINSUP_ATTEMPT hb=$TRAINSUP_HEARTBEATS; "
                         "echo ckpt=$TRAINSUP_CHECKPOINT_DIR; echo cwd=$(pwd); exit 0"));
  ASSERT_FALSE(id.empty());
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 1) << Describe(run);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_SUCCESS);
  const std::string log = RankLog(run, 1, 0);
  EXPECT_THAT(log, HasSubstr("hi\n"));
  EXPECT_THAT(log, HasSubstr("rank=0 world=1 local=1 attempt=1 hb=0\n"));
  EXPECT_THAT(log, HasSubstr("ckpt=" + run.run_dir() + "/checkpoints\n"));
  EXPECT_THAT(log, HasSubstr("cwd=" + fs::canonical(run.run_dir()).string() + "\n"));
}

TEST(CommandRun, ANonZeroExitIsRestartedLikeACrash) {
  DaemonHarness h;
  h.Set("commands.allowed_programs", "[\"/bin/sh\"]");
  ASSERT_TRUE(h.Start());
  // The first attempt leaves a marker in its working directory (the run
  // directory) and exits 3; the second finds it and exits 0.
  const std::string id =
      h.Submit(ShellSpec("crash",
                         "if [ -e marker ]; then echo second; exit 0; fi; touch marker; "
                         "echo first; exit 3"));
  ASSERT_FALSE(id.empty());
  v1::Run run;
  ASSERT_TRUE(h.WaitForEnd(id, kRunLimit, &run));
  EXPECT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << Describe(run);
  ASSERT_EQ(run.attempts_size(), 2) << Describe(run);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_EQ(run.attempts(0).exit_class(), v1::EXIT_CLASS_CRASH);
  ASSERT_EQ(run.attempts(0).ranks_size(), 1);
  EXPECT_EQ(run.attempts(0).ranks(0).exit_code(), 3);
  EXPECT_EQ(run.attempts(0).ranks(0).exit_reason(), "exit 3");
  EXPECT_EQ(run.attempts(1).exit_class(), v1::EXIT_CLASS_SUCCESS);
  EXPECT_THAT(RankLog(run, 1, 0), HasSubstr("first\n"));
  EXPECT_THAT(RankLog(run, 2, 0), HasSubstr("second\n"));
}

TEST(CommandRun, AProgramTheDaemonDoesNotAllowIsRefusedAtSubmitLeavingNothing) {
  DaemonHarness h;
  h.Set("commands.allowed_programs", "[\"/bin/sh\"]");
  ASSERT_TRUE(h.Start());
  ExpectRejectedLeavingNothing(
      h, {
             {"[command]\nargv = [\"/bin/ls\", \"/\"]\n",
              "is not allowed by the daemon's configuration"},
             {"[command]\nargv = [\"ls\"]\n", "is not allowed by the daemon's configuration"},
             {"[command]\nargv = [\"./train.sh\"]\n",
              "command.argv[0]: \"./train.sh\" is a relative path"},
             {"[command]\nargv = [\"/bin/sh\"]\ncwd = \"/etc\"\n",
              "command.cwd: \"/etc\" is outside the configured data roots"},
             {"[command]\nargv = [\"/bin/sh\"]\n[train]\nsteps = 3\n",
              "command: a command run has no [train] table"},
         });
}

TEST(CommandRun, WithoutAnAllowlistNoCommandRunIsAccepted) {
  DaemonHarness h;
  ASSERT_TRUE(h.Start());
  std::string id;
  grpc::Status s = h.TrySubmit("[command]\nargv = [\"/bin/sh\"]\n", h.operator_token(), &id);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "command.argv[0]: no program is allowed to run: set commands.allowed_programs or "
            "commands.allowed_dirs in the daemon's configuration");
  EXPECT_TRUE(id.empty());
}

}  // namespace
}  // namespace trainsup::integration
