// The worker's side of the worker channel (proto/trainsup/v1/worker.proto):
// one bidirectional gRPC stream to trainsupd that carries a Hello, then a
// heartbeat every interval, events and a final exit report, and brings back
// the daemon's commands (checkpoint now, stop). Torch-free, so the test
// worker uses it as well as the real one.
//
// Everything runs on background threads: no call here blocks the training
// loop for long (ReportExit waits only as long as it is told to). When the
// stream breaks the link reconnects with exponential backoff, forever, while
// training continues; the daemon may be restarting and re-adopts the worker
// when it reconnects (docs/design.md, adoption).
#ifndef TRAINSUP_WORKER_LINK_LINK_H_
#define TRAINSUP_WORKER_LINK_LINK_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "trainsup/v1/worker.grpc.pb.h"

namespace grpc {
class ClientContext;
}

namespace trainsup::worker {

struct LinkOptions {
  // "unix:/path/sock" or "host:port"; empty: a link that does nothing (a
  // worker started by hand for debugging).
  std::string endpoint;
  std::string run_id;
  int rank = 0;
  int attempt = 1;
  int world_size = 1;
  std::string token;  // the per-attempt secret (TRAINSUP_TOKEN)
  // Used until the daemon's Welcome names another interval.
  double heartbeat_interval_s = 1;
  double reconnect_initial_s = 0.1;
  double reconnect_max_s = 5;
  // Sent in the Hello; empty: this build's (contracts/version.h). Tests set
  // another to see the daemon refuse it.
  std::string version;
  // Called once, on the link's thread, when the daemon refuses the Hello
  // for a reason that no reconnect can mend (FailedPrecondition: a version
  // it cannot serve), with the daemon's message; the link then stops
  // reconnecting. trainsup-worker exits 64 with the message. Unset: the
  // link stops quietly.
  std::function<void(const std::string& message)> on_refused;
};

class SupervisorLink {
 public:
  // Events kept while they cannot be sent; beyond it the oldest are dropped.
  static constexpr size_t kMaxQueuedEvents = 1000;

  explicit SupervisorLink(LinkOptions options);
  // Stop().
  ~SupervisorLink();
  SupervisorLink(const SupervisorLink&) = delete;
  SupervisorLink& operator=(const SupervisorLink&) = delete;

  // Starts the background thread: connect, send Hello (token, run, rank,
  // attempt, pid, world size, version), and once the daemon's Welcome arrives send
  // queued events and a Heartbeat every interval. Any stream error closes
  // the stream and reconnects after a backoff that doubles from
  // reconnect_initial_s to reconnect_max_s (back to initial after a
  // welcomed connection), except a refusal (on_refused). No-op for an
  // empty endpoint or a second call.
  void Start();

  // The snapshot sent with the following heartbeats; its time_ms is set
  // when each heartbeat is sent.
  void UpdateProgress(const trainsup::v1::Progress& progress);
  // Advances the progress counter the daemon's hang detection watches.
  // Only the training loop calls it.
  void AdvanceProgress();
  // Queues an event. Events are sent in order once a connection is
  // welcomed, and wait across reconnects; beyond kMaxQueuedEvents the
  // oldest are dropped and counted (dropped_events()).
  void SendEvent(const trainsup::worker::v1::WorkerEvent& event);
  // Fault injection: while paused no heartbeats are sent (a frozen worker);
  // events still are.
  void SetHeartbeatsPaused(bool paused);
  // Queues an exit report (after any queued events) and waits up to
  // `timeout_s` until it has been written to a welcomed stream. False on
  // timeout, after Stop, or for a link without endpoint.
  bool ReportExit(const trainsup::worker::v1::ExitReport& report, double timeout_s);

  // True once for each CheckpointNow received (and not yet taken).
  bool TakeCheckpointRequest();
  // True once a Stop command arrived; its deadline (seconds).
  bool stop_requested() const { return stop_requested_.load(); }
  int stop_deadline_s() const { return stop_deadline_s_.load(); }

  // Whether a stream is open and welcomed now.
  bool connected() const { return connected_.load(); }
  // Welcomed connections so far (the daemon accepted the Hello).
  int64_t connects() const { return connects_.load(); }
  int64_t dropped_events() const;
  uint64_t progress_counter() const { return progress_counter_.load(); }

  // Closes the stream (half-close, then cancel if the daemon does not end
  // it promptly) and joins the threads. Idempotent; events not yet sent are
  // lost.
  void Stop();

 private:
  void Run();
  // One connection: returns when the stream ended or Stop was called.
  enum class Outcome { kWelcomed, kFailed, kRefused };
  Outcome RunConnection();
  // Waits for what the open connection sends next, in this order: (once
  // the daemon's Welcome arrived) the oldest queued event (*event_id: its
  // number, popped_events_), an exit report not yet written
  // (*exit_generation: its generation), else a heartbeat when
  // *next_heartbeat is due (then moved an interval on; none while paused).
  // False, with nothing to send, once Stop was called or the stream ended.
  bool NextMessage(std::chrono::steady_clock::time_point* next_heartbeat,
                   trainsup::worker::v1::WorkerMessage* message, int64_t* event_id,
                   int64_t* exit_generation);
  // After NextMessage's message was written: pops event `event_id` (>= 0)
  // if it is still at the front of the queue, and records that the exit
  // report of `exit_generation` (> 0) was written.
  void MarkWritten(int64_t event_id, int64_t exit_generation);
  void HandleCommand(const trainsup::worker::v1::SupervisorCommand& command);
  trainsup::worker::v1::WorkerMessage MakeHello() const;
  trainsup::worker::v1::WorkerMessage MakeHeartbeat();
  std::string refusal_;  // the daemon's message when Outcome::kRefused, under mu_

  const LinkOptions options_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stopping_ = false;
  bool finished_ = false;                   // Run returned
  grpc::ClientContext* context_ = nullptr;  // the open stream's, under mu_
  bool welcomed_ = false;                   // this connection's Welcome arrived
  bool stream_ended_ = false;               // this connection's reader saw the end
  double interval_s_;
  bool paused_ = false;
  std::deque<trainsup::worker::v1::WorkerEvent> events_;
  int64_t dropped_events_ = 0;
  int64_t popped_events_ = 0;  // events removed from the front so far
  std::optional<trainsup::worker::v1::ExitReport> exit_report_;
  int64_t exit_generation_ = 0;  // ReportExit calls so far
  int64_t exit_written_ = 0;     // the generation last written
  trainsup::v1::Progress progress_;
  int64_t heartbeat_seq_ = 0;

  std::atomic<uint64_t> progress_counter_{0};
  std::atomic<bool> checkpoint_requested_{false};
  std::atomic<bool> stop_requested_{false};
  std::atomic<int> stop_deadline_s_{0};
  std::atomic<bool> connected_{false};
  std::atomic<int64_t> connects_{0};
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_LINK_LINK_H_
