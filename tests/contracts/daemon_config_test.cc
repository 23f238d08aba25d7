#include "contracts/daemon_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/fault_injection_fs.h"
#include "tests/common/temp_dir.h"

namespace trainsup::supervisor {
namespace {

namespace fs = std::filesystem;

class TempDir : public ::trainsup::testing::TempDir {
 public:
  TempDir() : ::trainsup::testing::TempDir("config_test") {}
};

void WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

// The error message of parsing `text`, which must fail with InvalidArgument.
std::string ParseError(const std::string& text) {
  absl::StatusOr<DaemonConfig> config = ParseConfig(text, "/base");
  EXPECT_FALSE(config.ok()) << text;
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  return std::string(config.status().message());
}

TEST(Config, DefaultsMatchTheDocumentation) {
  const DaemonConfig d = DefaultConfig();
  EXPECT_EQ(d.daemon.state_dir, "./trainsup-state");
  EXPECT_EQ(d.daemon.socket_path, "");
  EXPECT_EQ(d.daemon.tcp_address, "");
  EXPECT_EQ(d.daemon.metrics_address, "");
  EXPECT_FALSE(d.daemon.metrics_allow_remote);
  EXPECT_TRUE(d.daemon.data_roots.empty());
  EXPECT_EQ(d.slots.cpu_slots, 1);
  EXPECT_TRUE(d.slots.use_gpus);
  EXPECT_EQ(d.slots.gpu_release_timeout_s, 30);
  EXPECT_EQ(d.slots.gpu_idle_memory_mb, 1024);
  EXPECT_EQ(d.workers.heartbeat_interval_s, 1);
  EXPECT_EQ(d.workers.heartbeat_timeout_s, 10);
  EXPECT_EQ(d.workers.term_grace_s, 10);
  EXPECT_EQ(d.workers.stop_deadline_s, 30);
  EXPECT_TRUE(d.workers.capture_stacks);
  EXPECT_EQ(d.workers.log_max_bytes, 16 << 20);
  EXPECT_EQ(d.workers.log_keep, 3);
  EXPECT_EQ(d.progress.startup_grace_s, 300);
  EXPECT_EQ(d.progress.safety_factor, 5);
  EXPECT_EQ(d.progress.min_timeout_s, 30);
  EXPECT_EQ(d.progress.max_timeout_s, 3600);
  EXPECT_EQ(d.progress.checkpoint_allowance_s, 600);
  EXPECT_EQ(d.progress.fixed_timeout_s, 0);
  EXPECT_EQ(d.restart.initial_backoff_s, 1);
  EXPECT_EQ(d.restart.max_backoff_s, 60);
  EXPECT_EQ(d.restart.multiplier, 2);
  EXPECT_EQ(d.restart.jitter, 0.1);
  EXPECT_EQ(d.restart.max_restarts, 10);
  EXPECT_EQ(d.restart.restart_window_s, 3600);
  EXPECT_EQ(d.restart.max_oom_restarts, 5);
  EXPECT_EQ(d.restart.crash_loop_attempts, 3);
  EXPECT_EQ(d.restart.oom_budget_factor, 1.0);
  EXPECT_EQ(d.checkpoints.keep, 3);
  EXPECT_TRUE(d.auth.tokens.empty());
  EXPECT_TRUE(d.auth.generate_default_tokens);
  EXPECT_EQ(d.testing.fake_gpu_file, "");
}

TEST(Config, EmptyFileGivesDefaultsResolvedAgainstBaseDir) {
  absl::StatusOr<DaemonConfig> config = ParseConfig("", "/srv/ts");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->daemon.state_dir, "/srv/ts/trainsup-state");
  EXPECT_EQ(config->daemon.socket_path, "/srv/ts/trainsup-state/run/trainsupd.sock");
  EXPECT_EQ(config->daemon.worker_binary, "");  // the daemon's choice
  EXPECT_EQ(config->slots.cpu_slots, DefaultConfig().slots.cpu_slots);
}

constexpr char kFullFile[] = R"(
[daemon]
state_dir = "state"
socket_path = "/run/trainsup/trainsupd.sock"
socket_group = "trainsup"
tcp_address = "0.0.0.0:50051"
tls_cert = "tls/server.pem"
tls_key = "tls/server.key"
tls_client_ca = "/etc/trainsup/ca.pem"
worker_binary = "bin/trainsup-worker"
metrics_address = "10.0.0.5:9100"
metrics_allow_remote = true
data_roots = ["data", "/mnt/scans/../datasets"]

[slots]
cpu_slots = 4
use_gpus = false
gpu_release_timeout_s = 12.5
gpu_idle_memory_mb = 512

[workers]
heartbeat_interval_s = 0.5
heartbeat_timeout_s = 5
term_grace_s = 3
stop_deadline_s = 20
capture_stacks = false
log_max_bytes = 1048576
log_keep = 2

[progress]
startup_grace_s = 60
safety_factor = 4
min_timeout_s = 10
max_timeout_s = 900
checkpoint_allowance_s = 120
fixed_timeout_s = 45

[restart]
initial_backoff_s = 0.5
max_backoff_s = 30
multiplier = 3
jitter = 0
max_restarts = 7
restart_window_s = 600
max_oom_restarts = 2
crash_loop_attempts = 4
oom_budget_factor = 0.75

[checkpoints]
keep = 5

[auth]
generate_default_tokens = false

[[auth.tokens]]
name = "ci"
role = "operator"
token_file = "tokens/ci.token"

[[auth.tokens]]
name = "grafana"
role = "viewer"
token_file = "/etc/trainsup/grafana.token"

[testing]
fake_gpu_file = "gpus.json"
)";

TEST(Config, FullFileIsReadAndRoundTrips) {
  absl::StatusOr<DaemonConfig> config = ParseConfig(kFullFile, "/etc/trainsup");
  ASSERT_TRUE(config.ok()) << config.status();
  const DaemonConfig& c = *config;
  EXPECT_EQ(c.daemon.state_dir, "/etc/trainsup/state");
  EXPECT_EQ(c.daemon.socket_path, "/run/trainsup/trainsupd.sock");
  EXPECT_EQ(c.daemon.socket_group, "trainsup");
  EXPECT_EQ(c.daemon.tcp_address, "0.0.0.0:50051");
  EXPECT_EQ(c.daemon.tls_cert, "/etc/trainsup/tls/server.pem");
  EXPECT_EQ(c.daemon.tls_key, "/etc/trainsup/tls/server.key");
  EXPECT_EQ(c.daemon.tls_client_ca, "/etc/trainsup/ca.pem");
  EXPECT_EQ(c.daemon.worker_binary, "/etc/trainsup/bin/trainsup-worker");
  EXPECT_EQ(c.daemon.metrics_address, "10.0.0.5:9100");
  EXPECT_TRUE(c.daemon.metrics_allow_remote);
  EXPECT_EQ(c.daemon.data_roots, (std::vector<std::string>{"/etc/trainsup/data", "/mnt/datasets"}));
  EXPECT_EQ(c.slots.cpu_slots, 4);
  EXPECT_FALSE(c.slots.use_gpus);
  EXPECT_EQ(c.slots.gpu_release_timeout_s, 12.5);
  EXPECT_EQ(c.slots.gpu_idle_memory_mb, 512);
  EXPECT_EQ(c.workers.heartbeat_interval_s, 0.5);
  EXPECT_EQ(c.workers.heartbeat_timeout_s, 5);
  EXPECT_EQ(c.workers.term_grace_s, 3);
  EXPECT_EQ(c.workers.stop_deadline_s, 20);
  EXPECT_FALSE(c.workers.capture_stacks);
  EXPECT_EQ(c.workers.log_max_bytes, 1048576);
  EXPECT_EQ(c.workers.log_keep, 2);
  EXPECT_EQ(c.progress.startup_grace_s, 60);
  EXPECT_EQ(c.progress.safety_factor, 4);
  EXPECT_EQ(c.progress.min_timeout_s, 10);
  EXPECT_EQ(c.progress.max_timeout_s, 900);
  EXPECT_EQ(c.progress.checkpoint_allowance_s, 120);
  EXPECT_EQ(c.progress.fixed_timeout_s, 45);
  EXPECT_EQ(c.restart.initial_backoff_s, 0.5);
  EXPECT_EQ(c.restart.max_backoff_s, 30);
  EXPECT_EQ(c.restart.multiplier, 3);
  EXPECT_EQ(c.restart.jitter, 0);
  EXPECT_EQ(c.restart.max_restarts, 7);
  EXPECT_EQ(c.restart.restart_window_s, 600);
  EXPECT_EQ(c.restart.max_oom_restarts, 2);
  EXPECT_EQ(c.restart.crash_loop_attempts, 4);
  EXPECT_EQ(c.restart.oom_budget_factor, 0.75);
  EXPECT_EQ(c.checkpoints.keep, 5);
  EXPECT_FALSE(c.auth.generate_default_tokens);
  ASSERT_EQ(c.auth.tokens.size(), 2u);
  EXPECT_EQ(c.auth.tokens[0].name, "ci");
  EXPECT_EQ(c.auth.tokens[0].role, TokenRole::kOperator);
  EXPECT_EQ(c.auth.tokens[0].token_file, "/etc/trainsup/tokens/ci.token");
  EXPECT_EQ(c.auth.tokens[1].name, "grafana");
  EXPECT_EQ(c.auth.tokens[1].role, TokenRole::kViewer);
  EXPECT_EQ(c.auth.tokens[1].token_file, "/etc/trainsup/grafana.token");
  EXPECT_EQ(c.testing.fake_gpu_file, "/etc/trainsup/gpus.json");

  // Formatted and parsed again (elsewhere: the paths are absolute now), it
  // is the same configuration.
  const std::string formatted = FormatConfig(c);
  absl::StatusOr<DaemonConfig> again = ParseConfig(formatted, "/elsewhere");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << formatted;
  EXPECT_EQ(FormatConfig(*again), formatted);
  EXPECT_EQ(again->restart.jitter, 0);
  EXPECT_EQ(again->workers.heartbeat_interval_s, 0.5);
  EXPECT_EQ(again->auth.tokens[1].role, TokenRole::kViewer);
}

TEST(Config, DefaultsRoundTrip) {
  const std::string formatted = FormatConfig(DefaultConfig());
  absl::StatusOr<DaemonConfig> again = ParseConfig(formatted, "/x");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << formatted;
  EXPECT_EQ(again->restart.jitter, 0.1);
  EXPECT_EQ(again->daemon.state_dir, "/x/trainsup-state");
}

// Derived paths come from StateLayout: one '/' between components, so a
// state directory of "/" gives "/run/trainsupd.sock", and the formatted
// configuration reads back to itself.
TEST(Config, RootStateDirDerivesCleanPathsAndRoundTrips) {
  for (const char* dir : {"/", "//", "/./"}) {
    absl::StatusOr<DaemonConfig> config =
        ParseConfig(absl::StrCat("[daemon]\nstate_dir = \"", dir, "\"\n"), "/base");
    ASSERT_TRUE(config.ok()) << dir << ": " << config.status();
    EXPECT_EQ(config->daemon.state_dir, "/") << dir;
    EXPECT_EQ(config->daemon.socket_path, "/run/trainsupd.sock") << dir;
    const std::string formatted = FormatConfig(*config);
    absl::StatusOr<DaemonConfig> again = ParseConfig(formatted, "/elsewhere");
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << formatted;
    EXPECT_EQ(FormatConfig(*again), formatted);
  }
}

TEST(Config, LoadConfigResolvesAgainstTheFilesDirectory) {
  TempDir dir;
  const std::string path = dir.path() + "/trainsupd.toml";
  WriteFile(path, "[daemon]\nstate_dir = \"st\"\ndata_roots = [\"./d/\"]\n", 0644);
  absl::StatusOr<DaemonConfig> config = LoadConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->daemon.state_dir, dir.path() + "/st");
  EXPECT_EQ(config->daemon.data_roots, std::vector<std::string>{dir.path() + "/d"});

  absl::StatusOr<DaemonConfig> missing = LoadConfig(dir.path() + "/nope.toml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  WriteFile(path, "[slots]\ncpu_slots = -1\n", 0644);
  absl::StatusOr<DaemonConfig> bad = LoadConfig(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), absl::string_view::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("slots.cpu_slots"), absl::string_view::npos);
}

TEST(Config, UnknownKeysAreNamed) {
  EXPECT_NE(ParseError("[slots]\ncpu_slot = 2\n").find("slots.cpu_slot: unknown key"),
            std::string::npos);
  EXPECT_NE(ParseError("[slot]\ncpu_slots = 2\n").find("slot: unknown key"), std::string::npos);
  EXPECT_NE(ParseError("verbose = true\n").find("verbose: unknown key"), std::string::npos);
  EXPECT_NE(ParseError("[[auth.tokens]]\nname = \"a\"\ntoken_file = \"f\"\nsecret = \"x\"\n")
                .find("auth.tokens[0].secret: unknown key"),
            std::string::npos);
}

TEST(Config, OutOfBoundNumbersNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"[slots]\ncpu_slots = 257\n", "slots.cpu_slots"},
      {"[slots]\ngpu_release_timeout_s = 0\n", "slots.gpu_release_timeout_s"},
      {"[workers]\nlog_max_bytes = 10\n", "workers.log_max_bytes"},
      {"[workers]\nheartbeat_interval_s = -1\n", "workers.heartbeat_interval_s"},
      {"[progress]\nsafety_factor = 0.5\n", "progress.safety_factor"},
      {"[restart]\njitter = 1.5\n", "restart.jitter"},
      {"[restart]\noom_budget_factor = 0\n", "restart.oom_budget_factor"},
      {"[restart]\noom_budget_factor = nan\n", "restart.oom_budget_factor"},
      {"[restart]\ncrash_loop_attempts = 0\n", "restart.crash_loop_attempts"},
      {"[checkpoints]\nkeep = 0\n", "checkpoints.keep"},
  };
  for (const auto& [text, field] : cases) {
    const std::string message = ParseError(text);
    EXPECT_NE(message.find(field), std::string::npos) << message;
    EXPECT_NE(message.find(": must be in "), std::string::npos) << message;
  }
}

TEST(Config, WrongTypesNameTheField) {
  EXPECT_NE(
      ParseError("[slots]\ncpu_slots = \"two\"\n").find("slots.cpu_slots: must be an integer"),
      std::string::npos);
  EXPECT_NE(ParseError("[slots]\ncpu_slots = 1.5\n").find("slots.cpu_slots"), std::string::npos);
  EXPECT_NE(ParseError("[slots]\nuse_gpus = 1\n").find("slots.use_gpus"), std::string::npos);
  EXPECT_NE(ParseError("[daemon]\ndata_roots = \"/data\"\n").find("daemon.data_roots"),
            std::string::npos);
  EXPECT_NE(ParseError("daemon = 3\n").find("daemon: must be a table"), std::string::npos);
}

TEST(Config, InconsistentCombinationsNameTheField) {
  EXPECT_NE(ParseError("[daemon]\ntcp_address = \"0.0.0.0:50051\"\n").find("daemon.tcp_address"),
            std::string::npos);
  EXPECT_NE(
      ParseError("[daemon]\ntcp_address = \"0.0.0.0:50051\"\ntls_cert = \"c\"\n").find("tls_key"),
      std::string::npos);
  EXPECT_NE(
      ParseError("[daemon]\nmetrics_address = \"0.0.0.0:9100\"\n").find("daemon.metrics_address"),
      std::string::npos);
  EXPECT_NE(ParseError("[daemon]\nmetrics_address = \"localhost\"\n").find("not host:port"),
            std::string::npos);
  EXPECT_NE(ParseError("[workers]\nheartbeat_timeout_s = 1\n").find("workers.heartbeat_timeout_s"),
            std::string::npos);
  EXPECT_NE(ParseError("[progress]\nmin_timeout_s = 100\nmax_timeout_s = 50\n")
                .find("progress.max_timeout_s"),
            std::string::npos);
  EXPECT_NE(ParseError("[restart]\ninitial_backoff_s = 10\nmax_backoff_s = 5\n")
                .find("restart.max_backoff_s"),
            std::string::npos);
  EXPECT_NE(ParseError("[[auth.tokens]]\nname = \"a\"\nrole = \"admin\"\ntoken_file = \"f\"\n")
                .find("auth.tokens[0].role"),
            std::string::npos);
  EXPECT_NE(ParseError("[[auth.tokens]]\nname = \"a\"\n").find("auth.tokens[0].token_file"),
            std::string::npos);
  EXPECT_NE(ParseError("[[auth.tokens]]\nname = \"a\"\ntoken_file = \"f\"\n"
                       "[[auth.tokens]]\nname = \"a\"\ntoken_file = \"g\"\n")
                .find("auth.tokens[1].name"),
            std::string::npos);
  EXPECT_NE(ParseError("[slots\n").find("line 1"), std::string::npos);
}

TEST(Config, EtcdTlsFilesAreResolvedAndComeInPairs) {
  absl::StatusOr<DaemonConfig> c = ParseConfig(
      "[cluster]\netcd_ca = \"tls/ca.pem\"\netcd_cert = \"tls/node.pem\"\n"
      "etcd_key = \"/keys/node.key\"\ninsecure_etcd = true\n",
      "/etc/trainsup");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.etcd_ca, "/etc/trainsup/tls/ca.pem");
  EXPECT_EQ(c->cluster.etcd_cert, "/etc/trainsup/tls/node.pem");
  EXPECT_EQ(c->cluster.etcd_key, "/keys/node.key");
  EXPECT_TRUE(c->cluster.insecure_etcd);
  absl::StatusOr<DaemonConfig> again = ParseConfig(FormatConfig(*c), "/elsewhere");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->cluster.etcd_key, "/keys/node.key");
  EXPECT_TRUE(again->cluster.insecure_etcd);
  EXPECT_FALSE(DefaultConfig().cluster.insecure_etcd);

  EXPECT_NE(ParseError("[cluster]\netcd_ca = \"c\"\netcd_cert = \"a\"\n")
                .find("cluster.etcd_key: a client certificate needs both"),
            std::string::npos);
  EXPECT_NE(ParseError("[cluster]\netcd_ca = \"c\"\netcd_key = \"k\"\n").find("cluster.etcd_cert"),
            std::string::npos);
  EXPECT_NE(ParseError("[cluster]\netcd_cert = \"a\"\netcd_key = \"k\"\n")
                .find("cluster.etcd_ca: required with cluster.etcd_cert"),
            std::string::npos);
}

TEST(CheckEtcdTransport, PlainTextOnlyToLoopbackUnlessTlsOrInsecure) {
  ClusterSection plain;
  for (const char* ok : {"127.0.0.1:2379", "127.4.5.6:1", "localhost:2379", "[::1]:2379"}) {
    EXPECT_TRUE(CheckEtcdTransport(plain, {ok}).ok()) << ok;
  }
  for (const char* remote : {"10.0.0.2:2379", "etcd.example:2379", "[2001:db8::1]:2379",
                             "0.0.0.0:2379", "128.0.0.1:2379"}) {
    absl::Status s = CheckEtcdTransport(plain, {"127.0.0.1:2379", remote});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << remote;
    EXPECT_NE(s.message().find(absl::StrCat("\"", remote, "\" is not a loopback address")),
              std::string::npos)
        << s;
  }
  ClusterSection tls;
  tls.etcd_ca = "/ca.pem";
  EXPECT_TRUE(CheckEtcdTransport(tls, {"10.0.0.2:2379"}).ok());
  ClusterSection insecure;
  insecure.insecure_etcd = true;
  EXPECT_TRUE(CheckEtcdTransport(insecure, {"10.0.0.2:2379"}).ok());
}

TEST(Config, CommandsAreAbsoluteAndNotResolvedAgainstTheFile) {
  absl::StatusOr<DaemonConfig> c = ParseConfig(
      "[commands]\nallowed_programs = [\"/usr/bin/python3\"]\nallowed_dirs = [\"/opt/tools\"]\n"
      "[workers]\npython_stack_wait_s = 2.5\n",
      "/etc/trainsup");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->commands.allowed_programs, std::vector<std::string>{"/usr/bin/python3"});
  EXPECT_EQ(c->commands.allowed_dirs, std::vector<std::string>{"/opt/tools"});
  EXPECT_DOUBLE_EQ(c->workers.python_stack_wait_s, 2.5);
  EXPECT_TRUE(DefaultConfig().commands.allowed_programs.empty());
  EXPECT_TRUE(DefaultConfig().commands.allowed_dirs.empty());
  EXPECT_DOUBLE_EQ(DefaultConfig().workers.python_stack_wait_s, 1);
  EXPECT_EQ(ParseError("[commands]\nallowed_programs = [\"python3\"]\n"),
            "commands.allowed_programs: 'python3' is not an absolute path");
  EXPECT_EQ(ParseError("[commands]\nallowed_dirs = [\"tools\"]\n"),
            "commands.allowed_dirs: 'tools' is not an absolute path");
  EXPECT_NE(ParseError("[workers]\npython_stack_wait_s = 61\n").find("workers.python_stack_wait_s"),
            std::string::npos);
  EXPECT_NE(ParseError("[commands]\nallowed_program = []\n").find("commands.allowed_program"),
            std::string::npos);
  // Written back by FormatConfig and read to the same values.
  absl::StatusOr<DaemonConfig> again = ParseConfig(FormatConfig(*c), "/elsewhere");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->commands.allowed_programs, c->commands.allowed_programs);
  EXPECT_EQ(again->commands.allowed_dirs, c->commands.allowed_dirs);
}

// The allowlist model of command.env (issue 42, 7): names and prefixes.
TEST(Config, CommandEnvNamesAreNamesOrPrefixes) {
  absl::StatusOr<DaemonConfig> c =
      ParseConfig("[commands]\nenv_names = [\"OMP_NUM_THREADS\", \"WANDB_*\"]\n", "/etc");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->commands.env_names, (std::vector<std::string>{"OMP_NUM_THREADS", "WANDB_*"}));
  EXPECT_TRUE(DefaultConfig().commands.env_names.empty());
  EXPECT_EQ(ParseConfig(FormatConfig(*c), "/etc")->commands.env_names, c->commands.env_names);
  for (const char* bad : {"*", "A-B", "1X", "A*B*", ""}) {
    EXPECT_EQ(ParseError(absl::StrCat("[commands]\nenv_names = [\"", bad, "\"]\n")),
              absl::StrCat("commands.env_names: '", bad,
                           "' is neither a variable name nor a prefix of one ending in '*'"))
        << bad;
  }
}

// With no token the daemon authorizes nobody apart: every caller is an
// operator, which only the socket's mode bounds. A TCP port has no such
// bound, so that combination is refused, naming the keys that make it.
TEST(Config, TcpWithoutAnyTokenIsRefused) {
  constexpr char kTcp[] =
      "[daemon]\ntcp_address = \"0.0.0.0:50051\"\ntls_cert = \"c\"\ntls_key = \"k\"\n";
  const std::string message =
      ParseError(absl::StrCat(kTcp, "[auth]\ngenerate_default_tokens = false\n"));
  for (const char* key : {"daemon.tcp_address", "auth.generate_default_tokens", "auth.tokens"}) {
    EXPECT_NE(message.find(key), std::string::npos) << "missing " << key << " in: " << message;
  }
  // Generated tokens or a configured one make TCP acceptable again, and a
  // unix socket alone may still go without tokens.
  EXPECT_TRUE(ParseConfig(kTcp, "/base").ok());
  EXPECT_TRUE(ParseConfig(absl::StrCat(kTcp,
                                       "[auth]\ngenerate_default_tokens = false\n"
                                       "[[auth.tokens]]\nname = \"ci\"\ntoken_file = \"f\"\n"),
                          "/base")
                  .ok());
  EXPECT_TRUE(ParseConfig("[auth]\ngenerate_default_tokens = false\n", "/base").ok());
}

// The same guard as the run spec's (contracts/toml_guard.h): non-ASCII outside
// strings and comments is refused before toml++ 3.3.0 sees it.
TEST(Config, NonAsciiOutsideStringsIsRefusedWithItsPosition) {
  const std::string message = ParseError("[slots]\ncpu_slots = 2\xc3\xa9\n");
  EXPECT_NE(message.find("non-ASCII character U+00E9 at line 2, column 14"), std::string::npos)
      << message;
  EXPECT_NE(ParseError("[slots]\ncpu_slots = 2\xc2\xa0\n").find("U+00A0 at line 2, column 14"),
            std::string::npos);
  EXPECT_NE(ParseError("\xc3\xa9").find("line 1, column 1"), std::string::npos);
  absl::StatusOr<DaemonConfig> fine =
      ParseConfig("# \xc3\xa9tat\n[daemon]\nsocket_group = \"\xc3\xa9quipe\"\n", "/base");
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->daemon.socket_group, "\xc3\xa9quipe");
}

TEST(Config, LoopbackMetricsAddressesAreAccepted) {
  for (const char* address : {"127.0.0.1:9100", "localhost:9100", "[::1]:9100", "127.3.2.1:1"}) {
    absl::StatusOr<DaemonConfig> config =
        ParseConfig(absl::StrCat("[daemon]\nmetrics_address = \"", address, "\"\n"), "/");
    EXPECT_TRUE(config.ok()) << address << ": " << config.status();
  }
  EXPECT_TRUE(ParseConfig("[daemon]\nmetrics_address = \"0.0.0.0:9100\"\n"
                          "metrics_allow_remote = true\n",
                          "/")
                  .ok());
}

TEST(TokenRole, StringsRoundTrip) {
  for (TokenRole role : {TokenRole::kViewer, TokenRole::kOperator}) {
    absl::StatusOr<TokenRole> back = TokenRoleFromString(ToString(role));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, role);
  }
  EXPECT_FALSE(TokenRoleFromString("admin").ok());
}

TEST(LoadTokens, ReadsConfiguredTokensAndRefusesWorldReadableOnes) {
  TempDir dir;
  WriteFile(dir.path() + "/ci.token", "  s3cret\n", 0600);
  WriteFile(dir.path() + "/view.token", "v1ew", 0640);
  absl::StatusOr<DaemonConfig> config = ParseConfig(
      "[[auth.tokens]]\nname = \"ci\"\nrole = \"operator\"\ntoken_file = \"ci.token\"\n"
      "[[auth.tokens]]\nname = \"dash\"\nrole = \"viewer\"\ntoken_file = \"view.token\"\n",
      dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::vector<Token>> tokens = LoadTokens(*config);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].name, "ci");
  EXPECT_EQ((*tokens)[0].role, TokenRole::kOperator);
  EXPECT_EQ((*tokens)[0].secret, "s3cret");
  EXPECT_EQ((*tokens)[1].secret, "v1ew");

  chmod((dir.path() + "/view.token").c_str(), 0644);
  tokens = LoadTokens(*config);
  ASSERT_FALSE(tokens.ok());
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(tokens.status().message().find("auth.tokens[1]"), absl::string_view::npos)
      << tokens.status();
}

// The socket's group is exactly the set of people who may call as viewers;
// an operator token they can read (or write) would make each an operator.
TEST(LoadTokens, OperatorTokensMustHaveNoGroupOrOtherBits) {
  TempDir dir;
  const std::string ci = dir.path() + "/ci.token";
  WriteFile(ci, "s3cret\n", 0600);
  WriteFile(dir.path() + "/view.token", "v1ew", 0640);
  absl::StatusOr<DaemonConfig> config = ParseConfig(
      "[[auth.tokens]]\nname = \"ci\"\nrole = \"operator\"\ntoken_file = \"ci.token\"\n"
      "[[auth.tokens]]\nname = \"dash\"\nrole = \"viewer\"\ntoken_file = \"view.token\"\n",
      dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(LoadTokens(*config).ok());
  for (mode_t mode : {0640, 0620, 0610, 0604, 0602}) {
    chmod(ci.c_str(), mode);
    absl::StatusOr<std::vector<Token>> tokens = LoadTokens(*config);
    ASSERT_FALSE(tokens.ok()) << absl::StrFormat("mode %04o", mode);
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kPermissionDenied);
    const std::string message(tokens.status().message());
    for (const std::string& want : {std::string("auth.tokens[0] ('ci')"), ci,
                                    absl::StrFormat("mode %04o", mode), std::string("0600")}) {
      EXPECT_NE(message.find(want), std::string::npos) << "missing " << want << " in: " << message;
    }
  }
  chmod(ci.c_str(), 0400);  // read-only for its owner is private too
  EXPECT_TRUE(LoadTokens(*config).ok());

  // A FIFO in a token file's place is refused, not waited on.
  ASSERT_EQ(unlink(ci.c_str()), 0);
  ASSERT_EQ(mkfifo(ci.c_str(), 0600), 0);
  absl::StatusOr<std::vector<Token>> fifo = LoadTokens(*config);
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("not a regular file"), absl::string_view::npos)
      << fifo.status();

  // A generated operator token someone opened to the group is refused too.
  TempDir state;
  absl::StatusOr<DaemonConfig> generated = ParseConfig("", state.path());
  ASSERT_TRUE(generated.ok());
  ASSERT_TRUE(LoadTokens(*generated).ok());
  const std::string op = state.path() + "/trainsup-state/auth/operator.token";
  chmod(op.c_str(), 0640);
  absl::StatusOr<std::vector<Token>> tokens = LoadTokens(*generated);
  ASSERT_FALSE(tokens.ok());
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(tokens.status().message().find(op), absl::string_view::npos) << tokens.status();
}

TEST(LoadTokens, GeneratesDefaultTokensOnceWithPrivateModes) {
  TempDir dir;
  absl::StatusOr<DaemonConfig> config = ParseConfig("", dir.path());
  ASSERT_TRUE(config.ok());
  absl::StatusOr<std::vector<Token>> first = LoadTokens(*config);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ((*first)[0].role, TokenRole::kOperator);
  EXPECT_EQ((*first)[1].role, TokenRole::kViewer);
  EXPECT_EQ((*first)[0].secret.size(), 64u);
  EXPECT_NE((*first)[0].secret, (*first)[1].secret);
  struct stat st;
  ASSERT_EQ(stat((dir.path() + "/trainsup-state/auth/operator.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((dir.path() + "/trainsup-state/auth/viewer.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);

  absl::StatusOr<std::vector<Token>> second = LoadTokens(*config);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0].secret, (*first)[0].secret);  // kept, not regenerated

  config->auth.generate_default_tokens = false;
  fs::remove_all(dir.path() + "/trainsup-state");
  absl::StatusOr<std::vector<Token>> none = LoadTokens(*config);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(fs::exists(dir.path() + "/trainsup-state/auth"));
}

// Generated tokens go through the checkpoint core's atomic write: a crash
// before the rename leaves no token file (and none half-written), a failed
// directory fsync is an error, and the file has its mode from the start.
TEST(LoadTokens, GeneratedTokensAreWrittenAtomicallyAndDurably) {
  TempDir dir;
  absl::StatusOr<DaemonConfig> config = ParseConfig("", dir.path());
  ASSERT_TRUE(config.ok());
  const std::string auth = dir.path() + "/trainsup-state/auth";

  ckpt::testing::FaultInjectionFileSystem crash;
  crash.crash_before_rename = true;
  absl::StatusOr<std::vector<Token>> tokens = LoadTokens(*config, &crash);
  EXPECT_FALSE(tokens.ok());
  EXPECT_FALSE(fs::exists(auth + "/operator.token"));

  ckpt::testing::FaultInjectionFileSystem no_dir_sync;
  no_dir_sync.fail_sync_at = 2;  // the file's fsync passes, the directory's fails
  tokens = LoadTokens(*config, &no_dir_sync);
  ASSERT_FALSE(tokens.ok());
  EXPECT_NE(tokens.status().message().find("fsync"), absl::string_view::npos) << tokens.status();
  EXPECT_EQ(no_dir_sync.syncs, 2);

  ckpt::testing::FaultInjectionFileSystem fine;
  tokens = LoadTokens(*config, &fine);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(fine.appends, 1);  // the viewer token; the operator's was kept
  EXPECT_FALSE(fs::exists(auth + "/viewer.token.tmp"));
  struct stat st;
  ASSERT_EQ(stat((auth + "/viewer.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

}  // namespace
}  // namespace trainsup::supervisor
