// The packaged deployment files agree with the daemon: deploy/trainsupd.toml
// parses with the daemon's own parser, and deploy/trainsupd.service gives it
// the directories and stop time that config asks for.
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "contracts/daemon_config.h"
#include "gtest/gtest.h"

namespace trainsup::supervisor {
namespace {

const std::string kDeployDir = std::string(TRAINSUP_SOURCE_DIR) + "/deploy";

// The unit's Key=Value lines (the last one wins, as for systemd's scalar
// settings); comments and section headers skipped.
std::map<std::string, std::string> ReadUnit(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::map<std::string, std::string> settings;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line[0] == '[') continue;
    const std::string::size_type eq = line.find('=');
    if (eq == std::string::npos) continue;
    settings[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return settings;
}

TEST(DeployConfig, PackagedConfigParsesWithTheSystemPaths) {
  absl::StatusOr<DaemonConfig> config = LoadConfig(kDeployDir + "/trainsupd.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->daemon.state_dir, "/var/lib/trainsup");
  EXPECT_EQ(config->daemon.socket_path, "/run/trainsup/trainsupd.sock");
  EXPECT_EQ(config->daemon.metrics_address, "127.0.0.1:9464");
  EXPECT_FALSE(config->daemon.metrics_allow_remote);
  EXPECT_FALSE(config->daemon.data_roots.empty());
  // Everything else is left at its documented default.
  const DaemonConfig defaults = DefaultConfig();
  EXPECT_EQ(config->workers.stop_deadline_s, defaults.workers.stop_deadline_s);
  EXPECT_EQ(config->workers.term_grace_s, defaults.workers.term_grace_s);
  EXPECT_EQ(config->restart.max_restarts, defaults.restart.max_restarts);
  EXPECT_TRUE(config->auth.tokens.empty());
}

TEST(DeployConfig, UnitProvidesWhatThePackagedConfigNeeds) {
  absl::StatusOr<DaemonConfig> config = LoadConfig(kDeployDir + "/trainsupd.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  std::map<std::string, std::string> unit = ReadUnit(kDeployDir + "/trainsupd.service");

  EXPECT_EQ(unit["ExecStart"], "/usr/bin/trainsupd --config /etc/trainsup/trainsupd.toml");
  EXPECT_EQ("/var/lib/" + unit["StateDirectory"], config->daemon.state_dir);
  EXPECT_EQ("/run/" + unit["RuntimeDirectory"] + "/trainsupd.sock", config->daemon.socket_path);
  EXPECT_EQ(unit["RuntimeDirectoryPreserve"], "yes");
  EXPECT_EQ(unit["KillMode"], "process");
  EXPECT_EQ(unit["PrivateDevices"], "");  // would hide /dev/nvidia*
  EXPECT_EQ(unit["DevicePolicy"], "");
  EXPECT_EQ(unit["MemoryDenyWriteExecute"], "");

  // systemd must not SIGKILL the daemon before its graceful worker stop
  // (stop deadline, then SIGTERM and the grace period) can finish.
  double timeout_stop_s = 0;
  ASSERT_TRUE(absl::SimpleAtod(unit["TimeoutStopSec"], &timeout_stop_s)) << unit["TimeoutStopSec"];
  EXPECT_GT(timeout_stop_s, config->workers.stop_deadline_s + config->workers.term_grace_s);
}

}  // namespace
}  // namespace trainsup::supervisor
