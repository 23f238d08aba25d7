#include "contracts/daemon_config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/file_system.h"
#include "contracts/run_layout.h"
#include "contracts/spec.h"
#include "contracts/toml_reader.h"

namespace trainsup::supervisor {
namespace {

namespace fs = std::filesystem;

// The one field reader of the spec and the config (toml_reader.h), with the
// first error kept in *status and later calls doing nothing, so parsing
// code reads as a flat list of fields (the same list TableWriter writes).
class TableReader {
 public:
  TableReader(const toml::table* table, std::string prefix, absl::Status* status)
      : fields_(table, std::move(prefix)), status_(status) {}

  void Fail(const std::string& key, const std::string& what) { Keep(fields_.Error(key, what)); }

  // The node at `key`, or null when absent or after an error.
  const toml::node* Get(const std::string& key) {
    const toml::node* node = fields_.Get(key);
    return status_->ok() ? node : nullptr;
  }

  void Int(const std::string& key, int64_t* out, int64_t lo, int64_t hi) {
    if (status_->ok()) Keep(fields_.Int(key, out, lo, hi));
  }
  // [lo, hi], or (lo, hi] when `open_low`.
  void Double(const std::string& key, double* out, double lo, double hi, bool open_low = false) {
    if (status_->ok()) Keep(fields_.Double(key, out, lo, hi, open_low));
  }
  void Bool(const std::string& key, bool* out) {
    if (status_->ok()) Keep(fields_.Bool(key, out));
  }
  void String(const std::string& key, std::string* out) {
    if (status_->ok()) Keep(fields_.String(key, out));
  }
  void StringList(const std::string& key, std::vector<std::string>* out) {
    if (status_->ok()) Keep(fields_.StringList(key, out));
  }

  // The sub-table at `key` (null when absent or after an error).
  const toml::table* Table(const std::string& key) {
    absl::StatusOr<const toml::table*> table = fields_.Table(key);
    if (!table.ok()) Keep(table.status());
    return status_->ok() ? *table : nullptr;
  }

  // Reports the first key of the table that was never read.
  void Finish() {
    if (status_->ok()) Keep(fields_.Finish());
  }

 private:
  void Keep(absl::Status s) {
    if (status_->ok() && !s.ok()) *status_ = std::move(s);
  }

  TomlFieldReader fields_;
  absl::Status* status_;
};

// `path` made absolute against `base` and normalized, without a trailing
// slash; empty stays empty.
std::string Resolve(const fs::path& base, const std::string& path) {
  if (path.empty()) return path;
  fs::path p(path);
  std::string out = (p.is_absolute() ? p : base / p).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

// Splits "host:port" or "[v6]:port"; false if malformed.
bool SplitHostPort(const std::string& address, std::string* host, int* port) {
  std::string port_text;
  if (!address.empty() && address[0] == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return false;
    }
    *host = address.substr(1, close - 1);
    port_text = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) return false;
    *host = address.substr(0, colon);
    if (host->find(':') != std::string::npos) return false;
    port_text = address.substr(colon + 1);
  }
  return !host->empty() && absl::SimpleAtoi(port_text, port) && *port >= 1 && *port <= 65535;
}

bool IsLoopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// Writes fields into a TOML table, with the same calls as TableReader reads
// them, so one list of fields serves both directions.
class TableWriter {
 public:
  void Int(const std::string& key, const int64_t* value, int64_t, int64_t) {
    table_.insert(key, *value);
  }
  void Double(const std::string& key, const double* value, double, double, bool = false) {
    table_.insert(key, *value);
  }
  void Bool(const std::string& key, const bool* value) { table_.insert(key, *value); }
  void String(const std::string& key, const std::string* value) { table_.insert(key, *value); }
  void StringList(const std::string& key, const std::vector<std::string>* values) {
    toml::array array;
    for (const std::string& value : *values) array.push_back(value);
    table_.insert(key, std::move(array));
  }
  void Finish() {}
  toml::table& table() { return table_; }

 private:
  toml::table table_;
};

// The fields of each table with their bounds (see config.h).
template <typename Visitor, typename Section>
void VisitDaemon(Visitor& v, Section& d) {
  v.String("state_dir", &d.state_dir);
  v.String("socket_path", &d.socket_path);
  v.String("socket_group", &d.socket_group);
  v.String("tcp_address", &d.tcp_address);
  v.String("tls_cert", &d.tls_cert);
  v.String("tls_key", &d.tls_key);
  v.String("tls_client_ca", &d.tls_client_ca);
  v.String("worker_binary", &d.worker_binary);
  v.String("metrics_address", &d.metrics_address);
  v.Bool("metrics_allow_remote", &d.metrics_allow_remote);
  v.StringList("data_roots", &d.data_roots);
  v.Int("max_watchers_per_client", &d.max_watchers_per_client, 1, 10000);
  v.Bool("worker_channel_on_tcp", &d.worker_channel_on_tcp);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitSlots(Visitor& v, Section& s) {
  v.Int("cpu_slots", &s.cpu_slots, 0, 256);
  v.Bool("use_gpus", &s.use_gpus);
  v.Double("gpu_release_timeout_s", &s.gpu_release_timeout_s, 0, 3600, /*open_low=*/true);
  v.Int("gpu_idle_memory_mb", &s.gpu_idle_memory_mb, 0, 10'000'000);
  v.Double("drain_stranded_after_s", &s.drain_stranded_after_s, 0, 1e6);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitWorkers(Visitor& v, Section& w) {
  v.Double("heartbeat_interval_s", &w.heartbeat_interval_s, 0, 60, true);
  v.Double("heartbeat_timeout_s", &w.heartbeat_timeout_s, 0, 3600, true);
  v.Double("term_grace_s", &w.term_grace_s, 0, 3600);
  v.Double("stop_deadline_s", &w.stop_deadline_s, 0, 86400, true);
  v.Bool("capture_stacks", &w.capture_stacks);
  v.Int("log_max_bytes", &w.log_max_bytes, 4096, int64_t{1} << 40);
  v.Int("log_keep", &w.log_keep, 0, 100);
  v.Double("hello_timeout_s", &w.hello_timeout_s, 0, 3600, true);
  v.Double("python_stack_wait_s", &w.python_stack_wait_s, 0, 60);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitProgress(Visitor& v, Section& p) {
  v.Double("startup_grace_s", &p.startup_grace_s, 0, 86400);
  v.Double("safety_factor", &p.safety_factor, 1, 1000);
  v.Double("min_timeout_s", &p.min_timeout_s, 0, 86400, true);
  v.Double("max_timeout_s", &p.max_timeout_s, 0, 1e6, true);
  v.Double("checkpoint_allowance_s", &p.checkpoint_allowance_s, 0, 86400);
  v.Double("fixed_timeout_s", &p.fixed_timeout_s, 0, 1e6);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitRestart(Visitor& v, Section& s) {
  v.Double("initial_backoff_s", &s.initial_backoff_s, 0, 3600);
  v.Double("max_backoff_s", &s.max_backoff_s, 0, 86400);
  v.Double("multiplier", &s.multiplier, 1, 100);
  v.Double("jitter", &s.jitter, 0, 1);
  v.Int("max_restarts", &s.max_restarts, 0, 1'000'000);
  v.Double("restart_window_s", &s.restart_window_s, 0, 1e7, true);
  v.Int("max_oom_restarts", &s.max_oom_restarts, 0, 1'000'000);
  v.Int("crash_loop_attempts", &s.crash_loop_attempts, 1, 1000);
  v.Double("oom_budget_factor", &s.oom_budget_factor, 0, 1, true);
  v.Int("min_free_space_mb", &s.min_free_space_mb, 0, 100'000'000);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitCheckpoints(Visitor& v, Section& c) {
  v.Int("keep", &c.keep, 1, 1000);
  v.Int("quarantine_keep", &c.quarantine_keep, 0, 1000);
  v.Int("quarantine_min_age_s", &c.quarantine_min_age_s, 0, 100000000);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitCommands(Visitor& v, Section& c) {
  v.StringList("allowed_programs", &c.allowed_programs);
  v.StringList("allowed_dirs", &c.allowed_dirs);
  v.StringList("deny_env", &c.deny_env);
  v.StringList("allow_env", &c.allow_env);
  v.StringList("env_names", &c.env_names);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitCluster(Visitor& v, Section& c) {
  v.String("node_name", &c.node_name);
  v.String("advertise_addr", &c.advertise_addr);
  v.String("etcd_ca", &c.etcd_ca);
  v.String("etcd_cert", &c.etcd_cert);
  v.String("etcd_key", &c.etcd_key);
  v.Bool("insecure_etcd", &c.insecure_etcd);
  v.Double("yield_after_s", &c.yield_after_s, 0, 86400);
  v.Finish();
}

template <typename Visitor, typename Section>
void VisitTesting(Visitor& v, Section& t) {
  v.String("fake_gpu_file", &t.fake_gpu_file);
  v.Bool("allow_fault_injection", &t.allow_fault_injection);
  v.Finish();
}

// Calls fn(name, visit) for every table but [auth], where visit(visitor)
// runs the table's Visit function on the matching section of `c`.
template <typename Config, typename Fn>
void ForEachSection(Config& c, Fn&& fn) {
  fn("daemon", [&](auto& v) { VisitDaemon(v, c.daemon); });
  fn("slots", [&](auto& v) { VisitSlots(v, c.slots); });
  fn("workers", [&](auto& v) { VisitWorkers(v, c.workers); });
  fn("progress", [&](auto& v) { VisitProgress(v, c.progress); });
  fn("restart", [&](auto& v) { VisitRestart(v, c.restart); });
  fn("checkpoints", [&](auto& v) { VisitCheckpoints(v, c.checkpoints); });
  fn("commands", [&](auto& v) { VisitCommands(v, c.commands); });
  fn("cluster", [&](auto& v) { VisitCluster(v, c.cluster); });
  fn("testing", [&](auto& v) { VisitTesting(v, c.testing); });
}

void ReadAuth(TableReader& r, AuthSection& a, absl::Status* status) {
  r.Bool("generate_default_tokens", &a.generate_default_tokens);
  const toml::node* tokens = r.Get("tokens");
  r.Finish();
  if (tokens == nullptr || !status->ok()) return;
  const toml::array* array = tokens->as_array();
  if (array == nullptr) return r.Fail("tokens", "must be an array of tables ([[auth.tokens]])");
  std::set<std::string> names;
  for (size_t i = 0; i < array->size() && status->ok(); ++i) {
    const std::string prefix = absl::StrCat("auth.tokens[", i, "]");
    const toml::table* table = array->get(i)->as_table();
    if (table == nullptr) {
      *status = absl::InvalidArgumentError(absl::StrCat(prefix, ": must be a table"));
      return;
    }
    TableReader t(table, prefix, status);
    TokenEntry entry;
    std::string role = ToString(entry.role);
    t.String("name", &entry.name);
    t.String("role", &role);
    t.String("token_file", &entry.token_file);
    t.Finish();
    if (!status->ok()) return;
    absl::StatusOr<TokenRole> parsed = TokenRoleFromString(role);
    if (!parsed.ok()) return t.Fail("role", std::string(parsed.status().message()));
    entry.role = *parsed;
    if (entry.name.empty()) return t.Fail("name", "required");
    if (!names.insert(entry.name).second)
      return t.Fail("name", "'" + entry.name + "' is used twice");
    if (entry.token_file.empty()) return t.Fail("token_file", "required");
    a.tokens.push_back(std::move(entry));
  }
}

// The [commands] lists: absolute paths, variable names, name patterns.
absl::Status CheckCommands(const CommandsSection& commands) {
  const auto bad = [](const std::string& field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  };
  // Not resolved against the file's directory: "python3" there would be a
  // file next to the configuration, not the interpreter.
  for (const auto& [key, paths] :
       {std::pair{"commands.allowed_programs", &commands.allowed_programs},
        std::pair{"commands.allowed_dirs", &commands.allowed_dirs}}) {
    for (const std::string& path : *paths) {
      if (path.empty() || path[0] != '/') {
        return bad(key, absl::StrCat("'", path, "' is not an absolute path"));
      }
    }
  }
  for (const auto& [key, names] : {std::pair{"commands.deny_env", &commands.deny_env},
                                   std::pair{"commands.allow_env", &commands.allow_env}}) {
    for (const std::string& name : *names) {
      if (!IsEnvVarName(name)) {
        return bad(key,
                   absl::StrCat("'", name,
                                "' is not a variable name (must match [A-Za-z_][A-Za-z0-9_]*)"));
      }
    }
  }
  for (const std::string& pattern : commands.env_names) {
    const bool prefix = !pattern.empty() && pattern.back() == '*';
    if (!IsEnvVarName(prefix ? pattern.substr(0, pattern.size() - 1) : pattern)) {
      return bad("commands.env_names",
                 absl::StrCat("'", pattern,
                              "' is neither a variable name nor a prefix of one ending in '*'"));
    }
  }
  for (const std::string& name : commands.allow_env) {
    if (std::find(commands.deny_env.begin(), commands.deny_env.end(), name) !=
        commands.deny_env.end()) {
      return bad("commands.allow_env", absl::StrCat("'", name, "' is also in commands.deny_env"));
    }
  }
  return absl::OkStatus();
}

// Constraints between fields, after each was read within its bounds.
absl::Status CheckCombinations(const DaemonConfig& c) {
  const auto bad = [](const std::string& field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  };
  if (c.workers.heartbeat_timeout_s <= c.workers.heartbeat_interval_s) {
    return bad("workers.heartbeat_timeout_s",
               absl::StrCat("must be greater than workers.heartbeat_interval_s (",
                            c.workers.heartbeat_interval_s, ")"));
  }
  if (c.progress.max_timeout_s < c.progress.min_timeout_s) {
    return bad("progress.max_timeout_s", absl::StrCat("must be at least progress.min_timeout_s (",
                                                      c.progress.min_timeout_s, ")"));
  }
  if (c.restart.max_backoff_s < c.restart.initial_backoff_s) {
    return bad("restart.max_backoff_s", absl::StrCat("must be at least restart.initial_backoff_s (",
                                                     c.restart.initial_backoff_s, ")"));
  }
  const ClusterSection& cl = c.cluster;
  if (cl.etcd_cert.empty() != cl.etcd_key.empty()) {
    return bad(cl.etcd_cert.empty() ? "cluster.etcd_cert" : "cluster.etcd_key",
               "a client certificate needs both cluster.etcd_cert and cluster.etcd_key");
  }
  if (!cl.etcd_cert.empty() && cl.etcd_ca.empty()) {
    return bad("cluster.etcd_ca",
               "required with cluster.etcd_cert: the CA that signed etcd's server certificate");
  }
  const DaemonSection& d = c.daemon;
  for (const std::string& root : d.data_roots) {
    // Workers get the roots ':'-joined (TRAINSUP_DATA_ROOTS).
    if (root.find(':') != std::string::npos) {
      return bad("daemon.data_roots", absl::StrCat("'", root, "' contains ':'"));
    }
  }
  std::string host;
  int port = 0;
  if (!d.tcp_address.empty()) {
    if (!SplitHostPort(d.tcp_address, &host, &port)) {
      return bad("daemon.tcp_address", absl::StrCat("'", d.tcp_address, "' is not host:port"));
    }
    if (d.tls_cert.empty() || d.tls_key.empty()) {
      return bad("daemon.tcp_address", "TCP requires TLS; set daemon.tls_cert and daemon.tls_key");
    }
    // Without a token every caller is an operator; on a unix socket its
    // mode bounds who that is, on a TCP port nothing does.
    if (c.auth.tokens.empty() && !c.auth.generate_default_tokens) {
      return bad("daemon.tcp_address",
                 "TCP with auth.generate_default_tokens = false and no auth.tokens would make "
                 "every caller on the port an operator; configure [[auth.tokens]] or set "
                 "auth.generate_default_tokens = true");
    }
  }
  if (!d.metrics_address.empty()) {
    if (!SplitHostPort(d.metrics_address, &host, &port)) {
      return bad("daemon.metrics_address",
                 absl::StrCat("'", d.metrics_address, "' is not host:port"));
    }
    if (!d.metrics_allow_remote && !IsLoopback(host)) {
      return bad("daemon.metrics_address",
                 absl::StrCat("'", d.metrics_address,
                              "' is not a loopback address (set daemon.metrics_allow_remote = "
                              "true to allow it)"));
    }
  }
  if (d.state_dir.empty()) return bad("daemon.state_dir", "must not be empty");
  if (absl::Status s = CheckCommands(c.commands); !s.ok()) return s;
  for (const std::string& root : d.data_roots) {
    if (root.empty()) return bad("daemon.data_roots", "empty path");
  }
  return absl::OkStatus();
}

// Makes every path absolute against `base` and fills in derived paths.
void ResolvePaths(const fs::path& base, DaemonConfig& c) {
  DaemonSection& d = c.daemon;
  d.state_dir = Resolve(base, d.state_dir);
  d.socket_path = d.socket_path.empty() ? StateLayout(d.state_dir).DefaultSocketPath()
                                        : Resolve(base, d.socket_path);
  for (std::string* path :
       {&d.tls_cert, &d.tls_key, &d.tls_client_ca, &d.worker_binary, &c.testing.fake_gpu_file,
        &c.cluster.etcd_ca, &c.cluster.etcd_cert, &c.cluster.etcd_key}) {
    *path = Resolve(base, *path);
  }
  for (std::string& root : d.data_roots) root = Resolve(base, root);
  for (TokenEntry& token : c.auth.tokens) token.token_file = Resolve(base, token.token_file);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Reads the secret of a token file. Nobody but its owner may read or write
// an operator token: the group is exactly the socket's users, whom a
// readable operator token would all make operators. A viewer token may be
// the group's, never the others'. The mode is checked on the opened file,
// so it is the mode of what is read.
absl::StatusOr<std::string> ReadSecret(const std::string& what, const std::string& path,
                                       TokenRole role) {
  // O_NONBLOCK: a FIFO in its place must not block the daemon in open().
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string message = absl::StrCat(what, ": cannot open ", path, ": ", strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
    return absl::InternalError(message);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat(what, ": cannot stat ", path, ": ", strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is not a regular file"));
  }
  const mode_t mode = st.st_mode & 07777;
  if (role == TokenRole::kOperator && (mode & 077) != 0) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: %s is accessible by its group or others (mode %04o); an operator token must be "
        "0600, readable by its owner only; run chmod 600 on it",
        what, path, mode));
  }
  if ((mode & (S_IROTH | S_IWOTH)) != 0) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: %s is accessible by others (mode %04o); run chmod o-rw on it", what, path, mode));
  }
  constexpr size_t kMaxTokenFile = 64 << 10;
  std::string text;
  char buffer[4096];
  ssize_t n;
  while (text.size() <= kMaxTokenFile && (n = read(fd, buffer, sizeof buffer)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat(what, ": cannot read ", path, ": ", strerror(err)));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (text.size() > kMaxTokenFile) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is larger than 64 KiB"));
  }
  std::string secret(absl::StripAsciiWhitespace(text));
  if (secret.empty())
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, " is empty"));
  return secret;
}

// Creates `path` with a random secret and `mode` unless it exists, through
// the atomic write (never seen half-written, durable once this returns).
absl::Status EnsureSecretFile(ckpt::FileSystem* fs, const std::string& path, mode_t mode) {
  if (fs->Exists(path)) return absl::OkStatus();
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("getrandom: ", strerror(errno)));
    got += static_cast<size_t>(n);
  }
  std::string secret;
  for (unsigned char b : bytes) secret += absl::StrFormat("%02x", b);
  secret += "\n";
  return fs->WriteFileAtomically(path, secret, mode);
}

}  // namespace

std::string ToString(TokenRole role) {
  switch (role) {
    case TokenRole::kViewer:
      return "viewer";
    case TokenRole::kOperator:
      return "operator";
  }
  return "unknown";
}

absl::StatusOr<TokenRole> TokenRoleFromString(const std::string& text) {
  if (text == "viewer") return TokenRole::kViewer;
  if (text == "operator") return TokenRole::kOperator;
  return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a role (viewer | operator)"));
}

DaemonConfig DefaultConfig() { return DaemonConfig(); }

absl::StatusOr<DaemonConfig> ParseConfig(const std::string& toml_text,
                                         const std::string& base_dir) {
  absl::StatusOr<toml::table> parsed = ParseTomlText(toml_text);
  if (!parsed.ok()) return parsed.status();
  const toml::table& root = *parsed;
  DaemonConfig c;
  absl::Status status;
  TableReader top(&root, "", &status);
  ForEachSection(c, [&](const char* name, auto visit) {
    const toml::table* table = top.Table(name);
    TableReader reader(table, name, &status);
    visit(reader);
  });
  const toml::table* auth = top.Table("auth");
  TableReader auth_reader(auth, "auth", &status);
  ReadAuth(auth_reader, c.auth, &status);
  top.Finish();
  if (!status.ok()) return status;
  if (absl::Status s = CheckCombinations(c); !s.ok()) return s;
  std::error_code ec;
  const fs::path base = fs::absolute(base_dir.empty() ? "." : base_dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad base directory '", base_dir, "'"));
  ResolvePaths(base, c);
  return c;
}

namespace {

// Every key of the configuration as a TOML table (FormatConfig's content).
toml::table ConfigTable(const DaemonConfig& config) {
  toml::table root;
  ForEachSection(config, [&](const char* name, auto visit) {
    TableWriter writer;
    visit(writer);
    root.insert(name, std::move(writer.table()));
  });
  toml::table auth;
  auth.insert("generate_default_tokens", config.auth.generate_default_tokens);
  toml::array tokens;
  for (const TokenEntry& token : config.auth.tokens) {
    tokens.push_back(toml::table{
        {"name", token.name}, {"role", ToString(token.role)}, {"token_file", token.token_file}});
  }
  if (!tokens.empty()) auth.insert("tokens", std::move(tokens));
  root.insert("auth", std::move(auth));
  return root;
}

}  // namespace

std::string FormatConfig(const DaemonConfig& config) {
  std::ostringstream out;
  out << toml::toml_formatter(ConfigTable(config), toml::format_flags::none) << "\n";
  return out.str();
}

std::vector<std::string> ChangedKeys(const DaemonConfig& a, const DaemonConfig& b) {
  const toml::table ta = ConfigTable(a), tb = ConfigTable(b);
  std::set<std::string> changed;
  auto compare = [&](const toml::table& x, const toml::table& y) {
    for (const auto& [section, node] : x) {
      const toml::table* xs = node.as_table();
      const toml::table* ys = y.get_as<toml::table>(section.str());
      if (xs == nullptr) continue;
      for (const auto& [key, value] : *xs) {
        const std::string name =
            absl::StrCat(std::string(section.str()), ".", std::string(key.str()));
        const toml::node* other = ys == nullptr ? nullptr : ys->get(key.str());
        if (other == nullptr || !(toml::node_view<const toml::node>(other) ==
                                  toml::node_view<const toml::node>(&value))) {
          changed.insert(name);
        }
      }
    }
  };
  compare(ta, tb);
  compare(tb, ta);
  return {changed.begin(), changed.end()};
}

absl::Status CheckEtcdTransport(const ClusterSection& cluster,
                                const std::vector<std::string>& endpoints) {
  if (!cluster.etcd_ca.empty() || cluster.insecure_etcd) return absl::OkStatus();
  for (const std::string& endpoint : endpoints) {
    std::string host;
    int port = 0;
    if (SplitHostPort(endpoint, &host, &port) && IsLoopback(host)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.etcd_endpoints: \"", endpoint,
        "\" is not a loopback address, and this daemon speaks to etcd without TLS: anyone on the "
        "network could then steer the job. Configure TLS ([cluster] etcd_ca, etcd_cert, etcd_key "
        "in the daemon's config) or, on a private network you trust, insecure_etcd = true"));
  }
  return absl::OkStatus();
}

std::string WorkerBinaryPath(const DaemonSection& daemon, const std::string& daemon_exe) {
  if (!daemon.worker_binary.empty()) return daemon.worker_binary;
  return (fs::path(daemon_exe).parent_path() / "trainsup-worker").string();
}

absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("config file ", path, " does not exist"));
  }
  absl::StatusOr<std::string> text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  const fs::path parent = fs::absolute(path, ec).parent_path();
  absl::StatusOr<DaemonConfig> config = ParseConfig(*text, parent.string());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<std::vector<Token>> LoadTokens(const DaemonConfig& config) {
  return LoadTokens(config, ckpt::FileSystem::Default());
}

absl::StatusOr<std::vector<Token>> LoadTokens(const DaemonConfig& config, ckpt::FileSystem* fs) {
  std::vector<Token> tokens;
  const std::vector<TokenEntry>& entries = config.auth.tokens;
  for (size_t i = 0; i < entries.size(); ++i) {
    absl::StatusOr<std::string> secret =
        ReadSecret(absl::StrCat("auth.tokens[", i, "] ('", entries[i].name, "')"),
                   entries[i].token_file, entries[i].role);
    if (!secret.ok()) return secret.status();
    tokens.push_back({entries[i].name, entries[i].role, *std::move(secret)});
  }
  if (!entries.empty() || !config.auth.generate_default_tokens) return tokens;

  const StateLayout layout(config.daemon.state_dir);
  if (absl::Status s = fs->CreateDirs(layout.AuthDir()); !s.ok()) return s;
  for (const auto& [role, mode] : {std::pair{TokenRole::kOperator, mode_t{0600}},
                                   std::pair{TokenRole::kViewer, mode_t{0640}}}) {
    const std::string name = ToString(role);
    const std::string path = layout.TokenPath(name);
    if (absl::Status s = EnsureSecretFile(fs, path, mode); !s.ok()) return s;
    absl::StatusOr<std::string> secret =
        ReadSecret("auth (generated " + name + " token)", path, role);
    if (!secret.ok()) return secret.status();
    tokens.push_back({name, role, *std::move(secret)});
  }
  return tokens;
}

}  // namespace trainsup::supervisor
