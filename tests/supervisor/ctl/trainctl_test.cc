// trainctl as a program: `watch` under a pseudo-terminal of 40 columns,
// against an in-process fake of trainsupd's API that replays a scripted run
// (progress to step 97 of 100, a long log event, the final checkpoint at
// step 100, success). The bytes trainctl writes are played on a small
// terminal model (wrapping at the width, "\r", "\n", erase-in-line), and the
// screen left behind must hold exactly the notable events, each intact on
// its own line, then one progress line at the final step: no piece of an
// earlier bar anywhere.
//
// TRAINCTL_BIN is a compile definition (the built binary).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"
#include "trainsup/v1/supervisor.grpc.pb.h"

namespace trainsup::supervisor {
namespace {

namespace v1 = ::trainsup::v1;

constexpr int kColumns = 40;
constexpr int64_t kT = 1795959901000;  // 2026-11-29T13:45:01Z

// Serves GetRun (the run as it was when watching began) and WatchRun (the
// scripted events, then the end of the stream).
class FakeSupervisor final : public v1::Supervisor::Service {
 public:
  FakeSupervisor(v1::Run run, std::vector<v1::RunEvent> events)
      : run_(std::move(run)), events_(std::move(events)) {}

  grpc::Status GetRun(grpc::ServerContext*, const v1::GetRunRequest* request,
                      v1::Run* out) override {
    if (request->run_id() != run_.run_id()) return grpc::Status(grpc::NOT_FOUND, "no such run");
    *out = run_;
    return grpc::Status::OK;
  }

  grpc::Status WatchRun(grpc::ServerContext*, const v1::WatchRunRequest*,
                        grpc::ServerWriter<v1::RunEvent>* writer) override {
    for (const v1::RunEvent& e : events_) {
      if (!writer->Write(e)) break;
    }
    return grpc::Status::OK;
  }

 private:
  v1::Run run_;
  std::vector<v1::RunEvent> events_;
};

// A terminal of `width` columns with automatic margins (a character written
// past the last column starts the next row), enough of VT100 for what
// trainctl writes: printable ASCII, CR, LF and CSI K / 2K / A. Anything else
// is recorded in `unsupported`.
class Screen {
 public:
  explicit Screen(int width) : width_(width) {}

  void Play(const std::string& bytes) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      const char c = bytes[i];
      if (c == '\x1b' && i + 1 < bytes.size() && bytes[i + 1] == '[') {
        size_t j = i + 2;
        std::string param;
        while (j < bytes.size() && (isdigit(static_cast<unsigned char>(bytes[j])) != 0)) {
          param += bytes[j++];
        }
        if (j == bytes.size()) break;
        Csi(param, bytes[j]);
        i = j;
      } else if (c == '\r') {
        col_ = 0;
        pending_wrap_ = false;
      } else if (c == '\n') {
        NextRow(/*wrapped=*/false);
        pending_wrap_ = false;
      } else if (c >= 0x20 && c < 0x7f) {
        Put(c);
      } else {
        unsupported += c;
      }
    }
  }

  // The screen's lines as the eye reads them: rows joined where a line
  // wrapped into the next row, trailing blanks dropped, empty lines too.
  std::vector<std::string> Lines() const {
    std::vector<std::string> lines;
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (wrapped_[r] && !lines.empty()) {
        lines.back() += rows_[r];
      } else {
        lines.push_back(rows_[r]);
      }
    }
    std::vector<std::string> out;
    for (std::string& line : lines) {
      while (!line.empty() && line.back() == ' ') line.pop_back();
      if (!line.empty()) out.push_back(line);
    }
    return out;
  }

  std::string unsupported;

 private:
  void Put(char c) {
    if (pending_wrap_) {
      NextRow(/*wrapped=*/true);
      col_ = 0;
      pending_wrap_ = false;
    }
    std::string& row = rows_[row_];
    if (static_cast<int>(row.size()) <= col_) row.resize(col_ + 1, ' ');
    row[col_] = c;
    if (col_ == width_ - 1) {
      pending_wrap_ = true;
    } else {
      ++col_;
    }
  }

  void NextRow(bool wrapped) {
    ++row_;
    if (row_ == static_cast<int>(rows_.size())) {
      rows_.emplace_back();
      wrapped_.push_back(wrapped);
    }
  }

  void Csi(const std::string& param, char final) {
    std::string& row = rows_[row_];
    if (final == 'K' && (param.empty() || param == "0")) {
      if (static_cast<int>(row.size()) > col_) row.resize(col_);
    } else if (final == 'K' && param == "2") {
      row.assign(row.size(), ' ');
    } else if (final == 'A') {
      row_ = std::max(0, row_ - (param.empty() ? 1 : std::atoi(param.c_str())));
    } else {
      unsupported += "CSI " + param + final + " ";
    }
  }

  int width_;
  std::vector<std::string> rows_{""};
  std::vector<bool> wrapped_{false};  // the row continues the one above
  int row_ = 0;
  int col_ = 0;
  bool pending_wrap_ = false;
};

v1::RunEvent Event(int64_t seq, v1::EventKind kind) {
  v1::RunEvent e;
  e.set_seq(seq);
  e.set_time_ms(kT + seq * 1000);
  e.set_run_id("run-1");
  e.set_kind(kind);
  e.set_attempt(1);
  e.set_rank(-1);
  return e;
}

struct Result {
  int exit_code = -1;
  std::string output;
};

// Runs `argv` on a new pseudo-terminal of kColumns x 50 and collects what
// it writes until it exits (killed after 60 s).
Result RunOnTerminal(const std::vector<std::string>& argv) {
  struct winsize size = {};
  size.ws_col = kColumns;
  size.ws_row = 50;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &size);
  if (pid == 0) {
    unsetenv("TRAINCTL_TOKEN");
    unsetenv("TRAINCTL_TOKEN_FILE");
    unsetenv("TRAINSUP_SOCKET");
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  Result result;
  if (pid < 0) return result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    struct pollfd p = {master, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const ssize_t n = read(master, buffer, sizeof buffer);
    if (n <= 0) break;  // EIO once the child has exited and closed the terminal
    result.output.append(buffer, static_cast<size_t>(n));
  }
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  close(master);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

TEST(TrainctlWatch, TerminalKeepsEventLinesWholeAndEndsAtTheFinalStep) {
  trainsup::testing::TempDir dir("trainctl_test");
  const std::string socket = dir.path() + "/api.sock";

  v1::Run run;
  run.set_run_id("run-1");
  run.set_state(v1::RUN_STATE_RUNNING);
  run.set_world_size(1);
  run.mutable_progress()->set_total_steps(100);

  std::vector<v1::RunEvent> events;
  int64_t seq = 0;
  v1::RunEvent running = Event(++seq, v1::EVENT_KIND_STATE);
  running.set_state(v1::RUN_STATE_RUNNING);
  running.set_reason("attempt 1 started");
  events.push_back(running);
  const std::string long_reason =
      "data: scene 17 of 40 has 1200000 points; split into 4 pieces to stay under the budget";
  for (int step = 1; step <= 97; ++step) {
    v1::RunEvent p = Event(++seq, v1::EVENT_KIND_PROGRESS);
    p.set_rank(0);
    p.mutable_progress()->set_step(step);
    p.mutable_progress()->set_total_steps(100);
    p.mutable_progress()->set_loss(0.1);
    p.mutable_progress()->set_phase(v1::PHASE_TRAINING);
    p.mutable_progress()->set_time_ms(kT + seq * 1000);
    events.push_back(p);
    if (step == 50) {
      v1::RunEvent log = Event(++seq, v1::EVENT_KIND_LOG);
      log.set_rank(0);
      log.set_reason(long_reason);
      events.push_back(log);
    }
  }
  v1::RunEvent checkpoint = Event(++seq, v1::EVENT_KIND_CHECKPOINT);
  checkpoint.set_rank(0);
  checkpoint.set_checkpoint_step(100);
  events.push_back(checkpoint);
  v1::RunEvent done = Event(++seq, v1::EVENT_KIND_STATE);
  done.set_state(v1::RUN_STATE_SUCCEEDED);
  done.set_reason("every rank completed");
  events.push_back(done);

  FakeSupervisor service(run, events);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  const Result result = RunOnTerminal({TRAINCTL_BIN, "--socket", socket, "watch", "run-1"});
  server->Shutdown();
  EXPECT_EQ(result.exit_code, 0) << result.output;

  Screen screen(kColumns);
  screen.Play(result.output);
  EXPECT_EQ(screen.unsupported, "");
  const std::vector<std::string> lines = screen.Lines();
  // Timestamps: kT + seq seconds (13:45:01 + 1 s, + 52 s, + 100 s, + 101 s).
  const std::vector<std::string> want_events = {
      "2026-11-29T13:45:02Z run-1 attempt 1 STATE RUNNING: attempt 1 started",
      "2026-11-29T13:45:53Z run-1 attempt 1 LOG " + long_reason,
      "2026-11-29T13:46:41Z run-1 attempt 1 CHECKPOINT step 100",
      "2026-11-29T13:46:42Z run-1 attempt 1 STATE SUCCEEDED: every rank completed",
  };
  std::string screen_text;
  for (const std::string& line : lines) screen_text += line + "\n";
  SCOPED_TRACE("the screen:\n" + screen_text);
  ASSERT_EQ(lines.size(), want_events.size() + 1);
  for (size_t i = 0; i < want_events.size(); ++i) EXPECT_EQ(lines[i], want_events[i]);
  // The progress line fits the terminal and shows the final step.
  const std::string& last = lines.back();
  EXPECT_LT(static_cast<int>(last.size()), kColumns);
  EXPECT_EQ(last.rfind("100/100 100%", 0), 0u) << last;
  EXPECT_NE(last.find(" SUCCEEDED"), std::string::npos) << last;
}

}  // namespace
}  // namespace trainsup::supervisor
