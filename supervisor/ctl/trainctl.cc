// trainctl: the command line of trainsupd's public API. Usage, output and
// exit codes are in docs/trainctl.md; what it prints is ctl_format's.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "contracts/spec.h"
#include "contracts/version.h"
#include "supervisor/ctl/completion.h"
#include "supervisor/ctl/ctl_config.h"
#include "supervisor/ctl/ctl_format.h"
#include "trainsup/v1/supervisor.grpc.pb.h"

namespace trainsup::supervisor {
namespace {

constexpr char kDefaultSocket[] = "/run/trainsup/trainsupd.sock";
// The step rate behind the ETA is measured over at most this much history.
constexpr int64_t kRateWindowMs = 5 * 60 * 1000;
constexpr auto kFollowPoll = std::chrono::milliseconds(250);
constexpr auto kRunPoll = std::chrono::seconds(2);

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// Columns of the terminal on stdout, asked at every redraw (it may have been
// resized); 80 when the terminal does not say.
int TerminalWidth() {
  struct winsize size;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

int Usage(const std::string& message) {
  std::cerr << "trainctl: " << message << "\n";
  return kExitUsage;
}

// Global options (before or after the command).
struct Options {
  CtlConnection flags;  // as given on the command line
  CtlConnection conn;   // flags, else the environment, else the config file
  double timeout_s = 10;
  std::string output = "text";
  bool json() const { return output == "json"; }
};

// One channel to trainsupd plus what every call carries: the bearer token
// and, for unary calls, the deadline.
class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, std::string endpoint, std::string token,
         double timeout_s)
      : stub_(v1::Supervisor::NewStub(channel)),
        endpoint_(std::move(endpoint)),
        token_(std::move(token)),
        timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000))) {}

  v1::Supervisor::Stub& stub() const { return *stub_; }

  // Sets up `ctx` for one call; streams get no deadline.
  void Prepare(grpc::ClientContext* ctx, bool unary) const {
    if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
    if (unary) ctx->set_deadline(std::chrono::system_clock::now() + timeout_);
  }

  // Prints why a call failed; returns the exit code for it.
  int Fail(const grpc::Status& status) const {
    const std::string code =
        absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
    std::cerr << "trainctl: " << code << ": " << status.error_message() << "\n";
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      std::cerr << "trainctl: is trainsupd running and reachable at " << endpoint_ << "?\n";
    }
    return ExitCodeForStatus(status.error_code());
  }

  grpc::Status GetRun(const std::string& run_id, v1::Run* run) const {
    grpc::ClientContext ctx;
    Prepare(&ctx, true);
    v1::GetRunRequest req;
    req.set_run_id(run_id);
    return stub_->GetRun(&ctx, req, run);
  }

 private:
  std::unique_ptr<v1::Supervisor::Stub> stub_;
  std::string endpoint_;
  std::string token_;
  std::chrono::milliseconds timeout_;
};

// --token-file, else $TRAINCTL_TOKEN, else the file $TRAINCTL_TOKEN_FILE,
// else the config file's token_file; empty when none is configured. False
// when a named file is unreadable.
bool LoadToken(const Options& o, std::string* token) {
  std::string file = o.flags.token_file;
  if (file.empty()) {
    *token = Env("TRAINCTL_TOKEN");
    if (!token->empty()) return true;
    file = o.conn.token_file;
    if (file.empty()) return true;
  }
  if (!ReadFile(file, token)) return false;
  *token = std::string(absl::StripAsciiWhitespace(*token));
  return true;
}

// o.conn: the flags, else the environment, else the config file
// (CtlConfigPath). Returns an exit code after printing why not.
int ResolveConnection(Options& o) {
  bool explicit_file = false;
  const std::string path = CtlConfigPath(Env, &explicit_file);
  CtlConnection file;
  struct stat st {};
  if (!path.empty() && stat(path.c_str(), &st) == 0) {
    std::string text;
    if (!ReadFile(path, &text)) return Usage("cannot read the config file " + path);
    const std::string::size_type slash = path.rfind('/');
    absl::StatusOr<CtlConnection> parsed =
        ParseCtlConfig(text, slash == std::string::npos ? "." : path.substr(0, slash));
    if (!parsed.ok()) return Usage(absl::StrCat(path, ": ", parsed.status().message()));
    file = *parsed;
  } else if (explicit_file) {
    return Usage("$TRAINCTL_CONFIG names " + path + ", which does not exist");
  }
  o.conn = MergeCtlConnection(o.flags, CtlConnectionFromEnv(Env), file);
  return kExitOk;
}

// Builds the client, or returns an exit code after printing why not.
int Connect(const Options& o, std::unique_ptr<Client>* client) {
  std::string token;
  if (!LoadToken(o, &token)) return Usage("cannot read the token file");
  if (absl::Status s = CheckCtlConnection(o.conn); !s.ok()) return Usage(std::string(s.message()));
  if (o.conn.address.empty()) {
    const std::string socket = o.conn.socket.empty() ? kDefaultSocket : o.conn.socket;
    *client = std::make_unique<Client>(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()), socket, token,
        o.timeout_s);
    return kExitOk;
  }
  // TCP is always TLS (docs/design.md, security): the system roots unless --tls-ca.
  grpc::SslCredentialsOptions ssl;
  const CtlConnection& c = o.conn;
  if (!c.tls_ca.empty() && !ReadFile(c.tls_ca, &ssl.pem_root_certs)) {
    return Usage("cannot read the TLS CA file " + c.tls_ca);
  }
  // The client's certificate, for a daemon that requires one
  // (daemon.tls_client_ca).
  if (!c.tls_cert.empty() && !ReadFile(c.tls_cert, &ssl.pem_cert_chain)) {
    return Usage("cannot read the TLS client certificate " + c.tls_cert);
  }
  if (!c.tls_key.empty() && !ReadFile(c.tls_key, &ssl.pem_private_key)) {
    return Usage("cannot read the TLS client key " + c.tls_key);
  }
  grpc::ChannelArguments args;
  if (!c.tls_server_name.empty()) args.SetSslTargetNameOverride(c.tls_server_name);
  *client = std::make_unique<Client>(
      grpc::CreateCustomChannel(c.address, grpc::SslCredentials(ssl), args), c.address, token,
      o.timeout_s);
  return kExitOk;
}

int PrintJson(const google::protobuf::Message& m, bool indent = true) {
  absl::StatusOr<std::string> json = ToJson(m, indent);
  if (!json.ok()) {
    std::cerr << "trainctl: " << json.status().message() << "\n";
    return kExitOther;
  }
  std::cout << *json << "\n";
  return kExitOk;
}

// The batch size of the run's spec: samples per step for the ETA; 0 if unknown.
int64_t SamplesPerStep(const v1::Run& run) {
  absl::StatusOr<RunSpec> spec = ParseRunSpec(run.spec_toml());
  return spec.ok() ? spec->train.batch_size : 0;
}

int Watch(const Client& client, const std::string& run_id, const Options& o) {
  v1::Run run;
  grpc::Status status = client.GetRun(run_id, &run);
  if (!status.ok()) return client.Fail(status);
  const bool tty = !o.json() && isatty(STDOUT_FILENO);
  const int64_t samples_per_step = SamplesPerStep(run);
  // The history replays every restart; counting starts over.
  run.set_restarts(0);
  run.set_oom_restarts(0);
  std::deque<v1::Progress> window;
  int64_t last_seq = 0;
  bool drawn = false;
  while (true) {
    grpc::ClientContext ctx;
    client.Prepare(&ctx, false);
    v1::WatchRunRequest req;
    req.set_run_id(run_id);
    // Always with history: after a reconnect the events already seen are
    // skipped by seq, so nothing in between is lost.
    req.set_include_history(true);
    std::unique_ptr<grpc::ClientReader<v1::RunEvent>> reader = client.stub().WatchRun(&ctx, req);
    v1::RunEvent e;
    while (reader->Read(&e)) {
      if (e.seq() > 0 && e.seq() <= last_seq) continue;
      last_seq = std::max(last_seq, e.seq());
      ApplyEvent(e, &run);
      if (o.json()) {
        absl::StatusOr<std::string> json = ToJson(e, false);
        if (json.ok()) std::cout << *json << std::endl;
      } else if (!tty) {
        std::cout << FormatEventLine(e) << std::endl;
      } else {
        if (e.kind() == v1::EVENT_KIND_PROGRESS) {
          if (!window.empty() && e.progress().step() < window.back().step()) window.clear();
          window.push_back(e.progress());
          while (window.front().time_ms() < e.progress().time_ms() - kRateWindowMs)
            window.pop_front();
        }
        // The progress line never fills its row (FormatProgressLine with
        // the width), so "\r" and erase-line remove all of it before the
        // next line is written; one that wrapped would leave rows behind.
        if (IsNotable(e)) std::cout << "\r\x1b[2K" << FormatEventLine(e) << "\n";
        const v1::Progress* previous = window.size() > 1 ? &window.front() : nullptr;
        std::cout << "\r\x1b[2K"
                  << FormatProgressLine(run,
                                        EstimateEtaMs(run.progress(), previous, samples_per_step),
                                        NowMs(), TerminalWidth())
                  << std::flush;
        drawn = true;
      }
      if (e.kind() == v1::EVENT_KIND_STATE && IsFinal(e.state())) {
        ctx.TryCancel();
        break;
      }
    }
    status = reader->Finish();
    if (IsFinal(run.state())) break;
    if (drawn) std::cout << "\n";
    drawn = false;
    if (!status.ok()) return client.Fail(status);
    // The daemon closed the stream before the run ended (e.g. it is
    // restarting): look again, then resume.
    v1::Run now;
    status = client.GetRun(run_id, &now);
    if (!status.ok()) return client.Fail(status);
    if (IsFinal(now.state())) {
      run.set_state(now.state());
      if (!o.json())
        std::cout << run_id << " " << ToString(now.state()) << ": " << now.reason() << "\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (drawn) std::cout << "\n";
  return ExitCodeForRunState(run.state());
}

int Submit(const Client& client, const std::string& spec_path, const std::string& request_id,
           bool watch, const Options& o) {
  v1::SubmitRunRequest req;
  if (!ReadFile(spec_path, req.mutable_spec_toml())) return Usage("cannot read " + spec_path);
  req.set_request_id(request_id);
  grpc::ClientContext ctx;
  client.Prepare(&ctx, true);
  v1::SubmitRunResponse resp;
  grpc::Status status = client.stub().SubmitRun(&ctx, req, &resp);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      std::cerr << "trainctl: spec rejected: " << status.error_message() << "\n";
      return kExitInvalidArgument;
    }
    return client.Fail(status);
  }
  if (o.json()) {
    PrintJson(resp, !watch);  // with --watch, the first of the JSON Lines
  } else {
    std::cout << resp.run_id() << std::endl;
  }
  return watch ? Watch(client, resp.run_id(), o) : kExitOk;
}

int List(const Client& client, const std::string& state_list, int limit, bool all,
         const Options& o) {
  absl::StatusOr<std::vector<v1::RunState>> states = RunStatesFromString(state_list);
  if (!states.ok()) return Usage(std::string(states.status().message()));
  v1::ListRunsResponse out;
  std::string token;
  do {
    v1::ListRunsRequest req;
    for (v1::RunState s : *states) req.add_states(s);
    req.set_page_size(all ? 500 : std::min(500, limit - out.runs_size()));
    req.set_page_token(token);
    grpc::ClientContext ctx;
    client.Prepare(&ctx, true);
    v1::ListRunsResponse page;
    grpc::Status status = client.stub().ListRuns(&ctx, req, &page);
    if (!status.ok()) return client.Fail(status);
    for (v1::Run& run : *page.mutable_runs()) {
      if (!all && out.runs_size() >= limit) break;
      *out.add_runs() = std::move(run);
    }
    token = page.next_page_token();
  } while (!token.empty() && (all || out.runs_size() < limit));
  if (o.json()) return PrintJson(out);
  std::cout << FormatRunsTable({out.runs().begin(), out.runs().end()}, NowMs());
  return kExitOk;
}

int Describe(const Client& client, const std::string& run_id, const Options& o) {
  v1::Run run;
  grpc::Status status = client.GetRun(run_id, &run);
  if (!status.ok()) return client.Fail(status);
  if (o.json()) return PrintJson(run);
  std::cout << FormatRunDescription(run, NowMs());
  return kExitOk;
}

int Cancel(const Client& client, const std::string& run_id, const std::string& reason,
           const Options& o) {
  v1::CancelRunRequest req;
  req.set_run_id(run_id);
  req.set_reason(reason);
  grpc::ClientContext ctx;
  client.Prepare(&ctx, true);
  v1::Run run;
  grpc::Status status = client.stub().CancelRun(&ctx, req, &run);
  if (!status.ok()) return client.Fail(status);
  if (o.json()) return PrintJson(run);
  std::cout << run.run_id() << " " << ToString(run.state()) << "\n";
  return kExitOk;
}

// trainctl checkpoint RUN / --all: waits for the commits (the daemon answers
// once each run has committed or failed, within `wait_s`); one line a run,
// "RUN step N" or "RUN failed: why". Exit 0 when every run committed,
// kExitRunFailed when any failed (the others still listed).
int Checkpoint(const Client& client, const std::string& run_id, bool all, double wait_s,
               const Options& o) {
  if (all == !run_id.empty()) {
    std::cerr << "trainctl checkpoint: name a run or give --all\n";
    return kExitUsage;
  }
  v1::CheckpointRunRequest req;
  req.set_run_id(run_id);
  req.set_all(all);
  req.set_timeout_s(wait_s);
  grpc::ClientContext ctx;
  client.Prepare(&ctx, false);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>((wait_s + 30) * 1000)));
  v1::CheckpointRunResponse out;
  grpc::Status status = client.stub().CheckpointRun(&ctx, req, &out);
  if (!status.ok()) return client.Fail(status);
  if (o.json()) PrintJson(out);
  int rc = kExitOk;
  for (const v1::CheckpointResult& r : out.results()) {
    if (!o.json()) {
      std::cout << r.run_id()
                << (r.error().empty() ? absl::StrCat(" step ", r.step()) : " failed: " + r.error())
                << "\n";
    }
    if (!r.error().empty()) rc = kExitRunFailed;
  }
  if (all && out.results().empty() && !o.json()) std::cout << "no run is running\n";
  return rc;
}

// trainctl drain SLOT --reason TEXT / trainctl undrain SLOT.
int DrainOrUndrain(const Client& client, bool drain, const std::string& slot,
                   const std::string& reason, const Options& o) {
  grpc::ClientContext ctx;
  client.Prepare(&ctx, true);
  v1::Slot out;
  grpc::Status status;
  if (drain) {
    v1::DrainSlotRequest req;
    req.set_slot(slot);
    req.set_reason(reason);
    status = client.stub().DrainSlot(&ctx, req, &out);
  } else {
    v1::UndrainSlotRequest req;
    req.set_slot(slot);
    status = client.stub().UndrainSlot(&ctx, req, &out);
  }
  if (!status.ok()) return client.Fail(status);
  if (o.json()) return PrintJson(out);
  std::cout << out.name() << " " << ToString(out.state());
  if (!out.run_id().empty())
    std::cout << " (rank " << out.rank() << " of " << out.run_id() << " is being stopped)";
  std::cout << "\n";
  return kExitOk;
}

int Node(const Client& client, const Options& o) {
  grpc::ClientContext ctx;
  client.Prepare(&ctx, true);
  v1::Node node;
  grpc::Status status = client.stub().GetNode(&ctx, v1::GetNodeRequest(), &node);
  if (!status.ok()) return client.Fail(status);
  if (o.json()) return PrintJson(node);
  std::cout << FormatNode(node);
  return kExitOk;
}

// A log file read from where the last read stopped. Survives copy-truncate
// rotation (the file shrinks: read again from the start) and rename
// rotation (the path names another file: finish the old one, then open the
// new one).
class LogFollower {
 public:
  explicit LogFollower(std::string path) : path_(std::move(path)) {}
  ~LogFollower() { Close(); }
  LogFollower(const LogFollower&) = delete;
  LogFollower& operator=(const LogFollower&) = delete;

  bool open() const { return fd_ >= 0; }

  // Copies what is new to stdout.
  void Poll() {
    if (fd_ < 0 && !Open()) return;
    struct stat file, named;
    if (fstat(fd_, &file) == 0 && file.st_size < offset_) {
      lseek(fd_, 0, SEEK_SET);
      offset_ = 0;
    }
    Drain();
    if (stat(path_.c_str(), &named) == 0 && fstat(fd_, &file) == 0 &&
        (named.st_ino != file.st_ino || named.st_dev != file.st_dev)) {
      Close();
      if (Open()) Drain();
    }
  }

 private:
  bool Open() {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    offset_ = 0;
    return fd_ >= 0;
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void Drain() {
    char buf[64 * 1024];
    ssize_t n;
    while ((n = ::read(fd_, buf, sizeof buf)) > 0) {
      std::cout.write(buf, n);
      offset_ += n;
    }
    std::cout.flush();
  }

  std::string path_;
  int fd_ = -1;
  off_t offset_ = 0;
};

int Logs(const Client& client, const std::string& run_id, int rank, int attempt, bool follow) {
  v1::Run run;
  grpc::Status status = client.GetRun(run_id, &run);
  if (!status.ok()) return client.Fail(status);
  absl::StatusOr<std::string> path = LogPath(run, attempt, rank);
  const bool waiting = follow && path.status().code() == absl::StatusCode::kFailedPrecondition;
  if (!path.ok() && !waiting) {
    std::cerr << "trainctl: " << path.status().message() << "\n";
    return ExitCodeForStatus(static_cast<grpc::StatusCode>(path.status().code()));
  }
  if (!follow) {
    LogFollower log(*path);
    log.Poll();
    if (!log.open()) {
      std::cerr << "trainctl: cannot open " << *path << "\n";
      return kExitNotFound;
    }
    return kExitOk;
  }
  // Without --attempt, -f moves on to each new attempt as the run restarts.
  int shown = path.ok() ? (attempt > 0 ? attempt : LatestAttempt(run)) : 0;
  std::unique_ptr<LogFollower> log;
  if (path.ok()) log = std::make_unique<LogFollower>(*path);
  auto next_check = std::chrono::steady_clock::now();
  while (true) {
    if (log) log->Poll();
    if (std::chrono::steady_clock::now() < next_check) {
      std::this_thread::sleep_for(kFollowPoll);
      continue;
    }
    next_check = std::chrono::steady_clock::now() + kRunPoll;
    status = client.GetRun(run_id, &run);
    if (!status.ok()) return client.Fail(status);
    if (attempt == 0 && LatestAttempt(run) != shown) {
      if (log) log->Poll();
      path = LogPath(run, 0, rank);
      if (!path.ok()) {
        std::cerr << "trainctl: " << path.status().message() << "\n";
        return ExitCodeForStatus(static_cast<grpc::StatusCode>(path.status().code()));
      }
      shown = LatestAttempt(run);
      std::cerr << "==> " << run_id << " attempt " << shown << ": " << *path << " <==\n";
      log = std::make_unique<LogFollower>(*path);
      continue;
    }
    if (IsFinal(run.state())) {
      if (log) log->Poll();
      return kExitOk;
    }
  }
}

// The options every command takes (before or after it): where trainsupd
// is, how to reach it, the token, the deadline, the output.
void AddGlobalOptions(CLI::App& app, Options& o) {
  app.add_option(
      "--socket", o.flags.socket,
      "trainsupd's unix socket ($TRAINSUP_SOCKET, else " + std::string(kDefaultSocket) + ")");
  app.add_option("--address", o.flags.address,
                 "HOST:PORT of trainsupd over TCP, always TLS ($TRAINCTL_ADDRESS)");
  app.add_option("--tls-ca", o.flags.tls_ca,
                 "CA certificates (PEM) for --address ($TRAINCTL_TLS_CA); default: system roots")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", o.flags.tls_cert,
                 "client certificate (PEM) for a daemon that requires one ($TRAINCTL_TLS_CERT)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", o.flags.tls_key, "its private key (PEM) ($TRAINCTL_TLS_KEY)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-server-name", o.flags.tls_server_name,
                 "name expected in the server certificate ($TRAINCTL_TLS_SERVER_NAME)");
  app.add_option("--token-file", o.flags.token_file,
                 "bearer token file (else $TRAINCTL_TOKEN, else the file $TRAINCTL_TOKEN_FILE)");
  app.add_option("--timeout", o.timeout_s, "deadline of each call, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-o,--output", o.output, "output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

int Main(int argc, char** argv) {
  CLI::App app("trainctl: submit, watch and inspect training runs of trainsupd");
  app.fallthrough();
  app.require_subcommand(1);
  app.set_version_flag("--version", absl::StrCat("trainctl ", Version()));
  Options o;
  AddGlobalOptions(app, o);

  std::string spec_path, request_id, run_id, state_list, reason;
  bool watch = false, all = false, follow = false;
  int limit = 50, rank = 0, attempt = 0;

  CLI::App* submit = app.add_subcommand("submit", "submit a run spec (TOML); prints the run id");
  submit->add_option("spec", spec_path, "run spec file")->required()->check(CLI::ExistingFile);
  submit->add_flag("--watch", watch, "then watch it; exit code by its final state");
  submit->add_option("--request-id", request_id,
                     "idempotency key: resubmitting returns the same run");

  CLI::App* ls = app.add_subcommand("ls", "list runs, newest first");
  ls->add_option("--state", state_list, "only these states, comma-separated (running,failed,...)");
  CLI::Option* limit_opt = ls->add_option("--limit", limit, "at most this many runs")
                               ->check(CLI::PositiveNumber)
                               ->capture_default_str();
  ls->add_flag("--all", all, "every run (no limit)")->excludes(limit_opt);

  CLI::App* describe = app.add_subcommand("describe", "one run in detail");
  describe->add_option("id", run_id, "run id")->required();

  CLI::App* watch_cmd =
      app.add_subcommand("watch", "follow a run until it ends; exit code by its final state");
  watch_cmd->add_option("id", run_id, "run id")->required();

  CLI::App* logs = app.add_subcommand("logs", "print a rank's log file (this machine only)");
  logs->add_option("id", run_id, "run id")->required();
  logs->add_option("--rank", rank, "rank")->check(CLI::NonNegativeNumber)->capture_default_str();
  logs->add_option("--attempt", attempt, "attempt number (default: the newest)")
      ->check(CLI::PositiveNumber);
  logs->add_flag("-f,--follow", follow, "keep printing until the run ends");

  CLI::App* cancel = app.add_subcommand("cancel", "cancel a run (checkpoint, then stop)");
  cancel->add_option("id", run_id, "run id")->required();
  cancel->add_option("--reason", reason, "recorded with the run");

  bool checkpoint_all = false;
  double checkpoint_wait_s = 600;
  CLI::App* checkpoint = app.add_subcommand(
      "checkpoint",
      "every rank of a run (--all: of every running run) writes a checkpoint at its next step; "
      "prints its step once committed");
  checkpoint->add_option("id", run_id, "run id");
  checkpoint->add_flag("--all", checkpoint_all, "every running run (before maintenance)");
  checkpoint->add_option("--wait", checkpoint_wait_s, "seconds to wait for the commits")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();

  CLI::App* node = app.add_subcommand("node", "this machine: GPUs, slots, runs");

  std::string slot, drain_reason;
  CLI::App* drain = app.add_subcommand(
      "drain", "take a slot out of service: its rank checkpoints and stops, none is placed there");
  drain->add_option("slot", slot, "gpu:N, cpu:N or the slot's index (trainctl node)")->required();
  drain->add_option("--reason", drain_reason, "why (shown in trainctl node)")->required();
  CLI::App* undrain = app.add_subcommand("undrain", "offer a drained slot again");
  undrain->add_option("slot", slot, "gpu:N, cpu:N or the slot's index")->required();

  std::string shell;
  CLI::App* completion = app.add_subcommand("completion",
                                            "print the shell completion script (bash), e.g. into "
                                            "/etc/bash_completion.d/trainctl");
  completion->add_option("shell", shell, "shell")->required()->check(CLI::IsMember({"bash"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  }

  if (*completion) {
    std::cout << BashCompletion(app, "trainctl");
    return kExitOk;
  }
  if (int rc = ResolveConnection(o); rc != kExitOk) return rc;
  std::unique_ptr<Client> client;
  if (int rc = Connect(o, &client); rc != kExitOk) return rc;
  if (*submit) return Submit(*client, spec_path, request_id, watch, o);
  if (*ls) return List(*client, state_list, limit, all, o);
  if (*describe) return Describe(*client, run_id, o);
  if (*watch_cmd) return Watch(*client, run_id, o);
  if (*logs) return Logs(*client, run_id, rank, attempt, follow);
  if (*cancel) return Cancel(*client, run_id, reason, o);
  if (*checkpoint) return Checkpoint(*client, run_id, checkpoint_all, checkpoint_wait_s, o);
  if (*node) return Node(*client, o);
  if (*drain) return DrainOrUndrain(*client, true, slot, drain_reason, o);
  if (*undrain) return DrainOrUndrain(*client, false, slot, "", o);
  return kExitUsage;
}

}  // namespace
}  // namespace trainsup::supervisor

int main(int argc, char** argv) { return trainsup::supervisor::Main(argc, argv); }
