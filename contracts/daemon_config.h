// The daemon's configuration: a TOML file (deploy/trainsupd.toml in the
// packages, docs/configuration.md for every knob). Every field has a default
// that works on a laptop, so an empty file is a valid configuration. Parsing
// is strict: an unknown key, a value of the wrong type or out of its bounds
// is InvalidArgument naming the key ("slots.cpu_slots"), never ignored.
//
// Paths: every relative path in the file is resolved against the directory
// the file is in (LoadConfig) or the `base_dir` given to ParseConfig, and
// derived paths (the default socket) are filled in, so a parsed config holds
// only absolute paths (except the ones left empty: "off" or "daemon's
// choice").
#ifndef TRAINSUP_CONTRACTS_DAEMON_CONFIG_H_
#define TRAINSUP_CONTRACTS_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainsup::ckpt {
class FileSystem;
}

namespace trainsup::supervisor {

// [daemon]
struct DaemonSection {
  std::string state_dir = "./trainsup-state";  // runs, store, logs, tokens
  std::string socket_path;                     // "" = <state_dir>/run/trainsupd.sock
  std::string socket_group;              // "" = keep the daemon's group; else chgrp the socket
  std::string tcp_address;               // "" = off; host:port, needs tls_cert and tls_key
  std::string tls_cert;                  // PEM server certificate (TCP only)
  std::string tls_key;                   // PEM private key (TCP only)
  std::string tls_client_ca;             // "" = no client certificates; else required and checked
  std::string worker_binary;             // "" = trainsup-worker next to the daemon binary
  std::string metrics_address;           // "" = off; host:port (Prometheus text)
  bool metrics_allow_remote = false;     // allow a non-loopback metrics_address
  std::vector<std::string> data_roots;   // run data must lie below one of these
  int64_t max_watchers_per_client = 16;  // 1..10000: WatchRun streams one token may hold
  // Serve the worker channel on tcp_address too (multi-machine workers);
  // off, it is on the unix socket only.
  bool worker_channel_on_tcp = false;
};

// [slots]
struct SlotsSection {
  int64_t cpu_slots = 1;              // 0..256: workers at once when no GPU is used
  bool use_gpus = true;               // one slot per GPU NVML reports
  double gpu_release_timeout_s = 30;  // (0, 3600]: wait for a dead worker's GPU memory
  int64_t gpu_idle_memory_mb = 1024;  // 0..10^7: used memory that counts as released
  // [0, 10^6]: a slot STRANDED this long is drained (docs/distributed.md,
  // "Elastic"); 0: never.
  double drain_stranded_after_s = 300;
};

// [workers]
struct WorkersSection {
  double heartbeat_interval_s = 1;   // (0, 60]: told to the worker
  double heartbeat_timeout_s = 10;   // (0, 3600], > heartbeat_interval_s: frozen after this
  double term_grace_s = 10;          // [0, 3600]: SIGTERM to SIGKILL of the process group
  double stop_deadline_s = 30;       // (0, 86400]: graceful stop/checkpoint before SIGTERM
  bool capture_stacks = true;        // stacks into the log before killing a hung worker
  int64_t log_max_bytes = 16 << 20;  // 4096..2^40: rotate a worker log above this
  int64_t log_keep = 3;              // 0..100: rotated copies kept (0: truncate only)
  double hello_timeout_s = 10;       // (0, 3600]: a worker stream must say Hello within this
  // [0, 60]: a frozen or hung command run's rank gets SIGUSR1 (the Python
  // client dumps its Python stacks into the log) this long before the
  // stack capture and the kill.
  double python_stack_wait_s = 1;
};

// [progress]: the hang detector's timeout, adaptive from observed step
// times unless fixed_timeout_s is set.
struct ProgressSection {
  double startup_grace_s = 300;         // [0, 86400]: before the first progress
  double safety_factor = 5;             // [1, 1000]: timeout = factor x slow step time
  double min_timeout_s = 30;            // (0, 86400]
  double max_timeout_s = 3600;          // [min_timeout_s, 10^6]
  double checkpoint_allowance_s = 600;  // [0, 86400]: added while checkpointing
  double fixed_timeout_s = 0;           // [0, 10^6]: 0 = adaptive; else this timeout
};

// [restart]
struct RestartSection {
  double initial_backoff_s = 1;     // [0, 3600]
  double max_backoff_s = 60;        // [initial_backoff_s, 86400]
  double multiplier = 2;            // [1, 100]
  double jitter = 0.1;              // [0, 1]: +- this fraction of the backoff
  int64_t max_restarts = 10;        // 0..10^6 within restart_window_s (OOM not counted)
  double restart_window_s = 3600;   // (0, 10^7]
  int64_t max_oom_restarts = 5;     // 0..10^6 within restart_window_s
  int64_t crash_loop_attempts = 3;  // 1..1000: failures in a row without progress
  double oom_budget_factor = 1.0;   // (0, 1]: memory budget x this after an OOM exit
  // 0..10^8: after a "no space" exit (74), relaunch only once the run
  // directory's file system has this much free, and at least twice the
  // newest checkpoint's size.
  int64_t min_free_space_mb = 256;
};

// [checkpoints]
struct CheckpointsSection {
  int64_t keep = 3;  // 1..1000: default for runs whose spec does not say
  // A run's quarantine (checkpoints that failed verification, or that a
  // rollback moved aside) keeps its newest quarantine_keep (0..1000) and
  // every one younger than quarantine_min_age_s (0..10^8 s); the rest are
  // deleted before the run's next attempt (docs/checkpoints.md).
  int64_t quarantine_keep = 3;
  int64_t quarantine_min_age_s = 86400;
};

// The role a token grants. viewer: get, list, watch, metrics; operator:
// also submit and cancel.
enum class TokenRole { kViewer, kOperator };
std::string ToString(TokenRole role);
// "viewer" | "operator"; InvalidArgument otherwise.
absl::StatusOr<TokenRole> TokenRoleFromString(const std::string& text);

// One [[auth.tokens]] entry. The secret is in token_file (see LoadTokens).
struct TokenEntry {
  std::string name;  // non-empty, unique: shown in logs and events
  TokenRole role = TokenRole::kViewer;
  std::string token_file;  // required
};

// [commands]: which programs a run spec's [command] may start
// (docs/configuration.md). Both empty (the default): no command run is
// accepted. Absolute paths; compared after resolving symlinks.
struct CommandsSection {
  std::vector<std::string> allowed_programs;  // these executables
  std::vector<std::string> allowed_dirs;      // any executable below these
  // command.env names refused besides the built-in list of variables that
  // load code (supervisor/policy/command_policy.h), and names of that list
  // allowed after all. Variable names; none in both.
  std::vector<std::string> deny_env;
  std::vector<std::string> allow_env;
  // The allowlist model: when set, command.env may set only names that
  // match one of these (a name, or a prefix ending in '*': "WANDB_*"), and
  // the list above still applies to them. Empty: any name but those.
  std::vector<std::string> env_names;
};

// [auth]
// This daemon as a node of multi-node jobs (run specs with a [cluster]
// table; docs/distributed.md).
struct ClusterSection {
  std::string node_name;       // "" = the host name; unique among a job's nodes
  std::string advertise_addr;  // "" = the host name: where other nodes reach rank 0's store
  // etcd over TLS: the CA that signed etcd's server certificate turns TLS
  // on for every endpoint; etcd_cert and etcd_key (PEM, both or neither)
  // are this node's client certificate, for an etcd started with
  // --client-cert-auth. Paths; read again at every join.
  std::string etcd_ca;
  std::string etcd_cert;
  std::string etcd_key;
  // Without TLS, a run spec whose etcd endpoint is not a loopback address
  // is refused, unless this is set (a private network the operator trusts).
  bool insecure_etcd = false;
  // A run waiting this long in its job's rendezvous gives its slots to a
  // queued multi-node job that orders before it (docs/distributed.md,
  // "Competing jobs").
  double yield_after_s = 10;
};

struct AuthSection {
  std::vector<TokenEntry> tokens;
  // With no tokens configured: create <state_dir>/auth/operator.token
  // (0600) and viewer.token (0640) if missing, and use them.
  bool generate_default_tokens = true;
};

// [testing]
struct TestingSection {
  std::string fake_gpu_file;  // "" = off; else GPUs come from this JSON file
  // Accept run specs with a [testing] table (fault injection: crashes,
  // hangs, corrupt checkpoints on purpose). Off in production.
  bool allow_fault_injection = false;
};

struct DaemonConfig {
  DaemonSection daemon;
  SlotsSection slots;
  WorkersSection workers;
  ProgressSection progress;
  RestartSection restart;
  CheckpointsSection checkpoints;
  CommandsSection commands;
  ClusterSection cluster;
  AuthSection auth;
  TestingSection testing;
};

// The defaults, exactly as documented above: paths unresolved and derived
// paths empty. ParseConfig("", dir) gives the same, resolved against dir.
DaemonConfig DefaultConfig();

// Parses and validates `toml_text`; relative paths are resolved against
// `base_dir` (made absolute against the working directory if relative).
// InvalidArgument naming the key for a syntax error (with line and column;
// a non-ASCII character outside strings and comments is one, refused before
// the TOML parser sees it, see contracts/toml_guard.h),
// an unknown key, a wrong type, a value out of bounds or an inconsistent
// combination (tcp_address without tls_cert and tls_key, or with neither
// auth.tokens nor auth.generate_default_tokens, which would make every
// caller on the port an operator; a remote metrics_address without
// metrics_allow_remote).
absl::StatusOr<DaemonConfig> ParseConfig(const std::string& toml_text, const std::string& base_dir);

// The configuration as a TOML file that ParseConfig reads back to the same
// values: every key, defaults included (for `trainsupd --print-config`).
std::string FormatConfig(const DaemonConfig& config);

// The keys ("section.key") whose values differ between `a` and `b`, sorted;
// the [[auth.tokens]] list compares as one key, "auth.tokens".
std::vector<std::string> ChangedKeys(const DaemonConfig& a, const DaemonConfig& b);

// The worker program a daemon whose own binary is `daemon_exe` launches:
// daemon.worker_binary, or trainsup-worker beside `daemon_exe` when that is
// "" (`trainsupd --print-worker-binary`; deploy/build-worker.sh installs
// the worker there).
std::string WorkerBinaryPath(const DaemonSection& daemon, const std::string& daemon_exe);

// Reads `path` and parses it with its directory as base_dir. NotFound if
// the file does not exist; errors name the file.
absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path);

// Whether this node may speak to etcd at `endpoints` (a run spec's
// cluster.etcd_endpoints, host:port each): with cluster.etcd_ca set (TLS)
// or cluster.insecure_etcd, any; otherwise only loopback hosts
// (127.0.0.0/8, ::1, localhost). InvalidArgument naming the endpoint and
// the two ways out.
absl::Status CheckEtcdTransport(const ClusterSection& cluster,
                                const std::vector<std::string>& endpoints);

// A token the daemon accepts.
struct Token {
  std::string name;
  TokenRole role = TokenRole::kViewer;
  std::string secret;
};

// Reads the secrets of auth.tokens (each file's content without surrounding
// whitespace; an empty file is an error). PermissionDenied naming the entry,
// the file and its mode for an operator token with any group or other
// permission bit (it must be 0600 or stricter: the group is the socket's
// users, who would all become operators) and for a viewer token that others
// may read or write (0640 is fine); InvalidArgument for a token file that
// is not a regular file (a FIFO is not waited on). With no tokens
// configured and generate_default_tokens, makes
// <state_dir>/auth/{operator,viewer}.token (random, 0600 and 0640 less the
// umask) when missing, through `fs`'s atomic write, and returns them; with
// no tokens and no generation, an empty list.
absl::StatusOr<std::vector<Token>> LoadTokens(const DaemonConfig& config);
absl::StatusOr<std::vector<Token>> LoadTokens(const DaemonConfig& config, ckpt::FileSystem* fs);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_CONTRACTS_DAEMON_CONFIG_H_
