#include "worker/link/link.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "contracts/version.h"

namespace trainsup::worker {
namespace {

using Clock = std::chrono::steady_clock;
using trainsup::worker::v1::SupervisorCommand;
using trainsup::worker::v1::WorkerMessage;

// How long a stopping link waits for the daemon to end the half-closed
// stream, and how long Stop waits for the thread before cancelling.
constexpr auto kHalfCloseGrace = std::chrono::milliseconds(500);
constexpr auto kStopGrace = std::chrono::seconds(2);

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

int Millis(double s) { return static_cast<int>(std::max(1.0, s * 1000)); }

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A stub on a new channel to `options`.endpoint. A channel per connection,
// with its own subchannel pool and our backoff: gRPC's shared subchannels
// would otherwise impose their own reconnect delays (up to two minutes) on
// top of ours.
std::unique_ptr<trainsup::worker::v1::WorkerChannel::Stub> NewStub(const LinkOptions& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(options.reconnect_initial_s));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, Millis(options.reconnect_initial_s));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(options.reconnect_max_s));
  auto channel =
      grpc::CreateCustomChannel(options.endpoint, grpc::InsecureChannelCredentials(), args);
  return trainsup::worker::v1::WorkerChannel::NewStub(channel);
}

}  // namespace

SupervisorLink::SupervisorLink(LinkOptions options)
    : options_(std::move(options)), interval_s_(options_.heartbeat_interval_s) {}

SupervisorLink::~SupervisorLink() { Stop(); }

void SupervisorLink::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopping_ || options_.endpoint.empty()) return;
  started_ = true;
  thread_ = std::thread([this] { Run(); });
}

void SupervisorLink::UpdateProgress(const trainsup::v1::Progress& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = progress;
}

void SupervisorLink::AdvanceProgress() { progress_counter_.fetch_add(1); }

void SupervisorLink::SendEvent(const trainsup::worker::v1::WorkerEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(event);
  while (events_.size() > kMaxQueuedEvents) {
    events_.pop_front();
    ++dropped_events_;
    ++popped_events_;
  }
  cv_.notify_all();
}

void SupervisorLink::SetHeartbeatsPaused(bool paused) {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = paused;
  cv_.notify_all();
}

bool SupervisorLink::ReportExit(const trainsup::worker::v1::ExitReport& report, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_ || stopping_) return false;
  exit_report_ = report;
  const int64_t generation = ++exit_generation_;
  cv_.notify_all();
  cv_.wait_for(lock, Seconds(timeout_s), [&] { return exit_written_ >= generation || finished_; });
  return exit_written_ >= generation;
}

bool SupervisorLink::TakeCheckpointRequest() { return checkpoint_requested_.exchange(false); }

int64_t SupervisorLink::dropped_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_events_;
}

void SupervisorLink::Stop() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    // A write blocked on flow control, or a connect that hangs, only ends
    // when the call is cancelled.
    if (!cv_.wait_for(lock, kStopGrace, [&] { return finished_ || !started_; }) &&
        context_ != nullptr) {
      context_->TryCancel();
    }
  }
  if (thread_.joinable()) thread_.join();
}

void SupervisorLink::Run() {
  double backoff_s = options_.reconnect_initial_s;
  for (;;) {
    const Outcome outcome = RunConnection();
    if (outcome == Outcome::kRefused) {
      std::string message;
      {
        std::lock_guard<std::mutex> lock(mu_);
        message = refusal_;
      }
      if (options_.on_refused) options_.on_refused(message);
      break;
    }
    if (outcome == Outcome::kWelcomed) backoff_s = options_.reconnect_initial_s;
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, Seconds(backoff_s), [&] { return stopping_; })) break;
    backoff_s = std::min(backoff_s * 2, options_.reconnect_max_s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
  cv_.notify_all();
}

SupervisorLink::Outcome SupervisorLink::RunConnection() {
  auto stub = NewStub(options_);
  grpc::ClientContext context;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Outcome::kFailed;
    context_ = &context;
    welcomed_ = false;
    stream_ended_ = false;
  }
  auto stream = stub->Connect(&context);
  bool ok = stream->Write(MakeHello());

  std::thread reader([&] {
    SupervisorCommand command;
    while (stream->Read(&command)) HandleCommand(command);
    std::lock_guard<std::mutex> lock(mu_);
    stream_ended_ = true;
    cv_.notify_all();
  });

  Clock::time_point next_heartbeat = Clock::now();
  while (ok) {
    WorkerMessage message;
    int64_t event_id = -1;
    int64_t exit_generation = 0;
    if (!NextMessage(&next_heartbeat, &message, &event_id, &exit_generation)) break;
    if (!stream->Write(message)) break;
    MarkWritten(event_id, exit_generation);
  }

  bool welcomed = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    welcomed = welcomed_;
    if (stopping_ && !stream_ended_) {
      lock.unlock();
      stream->WritesDone();
      lock.lock();
      cv_.wait_for(lock, kHalfCloseGrace, [&] { return stream_ended_; });
    }
  }
  // A stream the daemon ended has its status already; cancelling it now
  // would replace that status (a refusal's reason) with CANCELLED.
  bool ended = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended = stream_ended_;
  }
  if (!ended) context.TryCancel();
  reader.join();
  const grpc::Status finish = stream->Finish();
  std::lock_guard<std::mutex> lock(mu_);
  context_ = nullptr;
  welcomed_ = false;
  connected_ = false;
  if (welcomed) return Outcome::kWelcomed;
  if (finish.error_code() == grpc::StatusCode::FAILED_PRECONDITION && !stopping_) {
    refusal_ = finish.error_message();
    return Outcome::kRefused;
  }
  return Outcome::kFailed;
}

bool SupervisorLink::NextMessage(Clock::time_point* next_heartbeat, WorkerMessage* message,
                                 int64_t* event_id, int64_t* exit_generation) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stopping_ || stream_ended_) return false;
    // Nothing but the Hello goes out before the daemon accepted it:
    // events written to a stream it then rejects would be lost.
    if (!welcomed_) {
      cv_.wait(lock);
      continue;
    }
    if (!events_.empty()) {
      *message->mutable_event() = events_.front();
      *event_id = popped_events_;
      return true;
    }
    if (exit_report_ && exit_written_ < exit_generation_) {
      *message->mutable_exit() = *exit_report_;
      *exit_generation = exit_generation_;
      return true;
    }
    if (paused_) {
      cv_.wait(lock);
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now >= *next_heartbeat) {
      *message = MakeHeartbeat();
      *next_heartbeat = now + Seconds(interval_s_);
      return true;
    }
    cv_.wait_until(lock, *next_heartbeat);
  }
}

void SupervisorLink::MarkWritten(int64_t event_id, int64_t exit_generation) {
  std::lock_guard<std::mutex> lock(mu_);
  // The event may have been dropped from the full queue while it was
  // being written; pop it only if it is still at the front.
  if (event_id >= 0 && event_id == popped_events_ && !events_.empty()) {
    events_.pop_front();
    ++popped_events_;
  }
  if (exit_generation > 0) {
    exit_written_ = std::max(exit_written_, exit_generation);
    cv_.notify_all();
  }
}

void SupervisorLink::HandleCommand(const SupervisorCommand& command) {
  switch (command.body_case()) {
    case SupervisorCommand::kWelcome: {
      std::lock_guard<std::mutex> lock(mu_);
      if (command.welcome().heartbeat_interval_ms() > 0) {
        interval_s_ = command.welcome().heartbeat_interval_ms() / 1000.0;
      }
      if (!welcomed_) {
        welcomed_ = true;
        connected_ = true;
        connects_.fetch_add(1);
      }
      cv_.notify_all();
      break;
    }
    case SupervisorCommand::kCheckpointNow:
      checkpoint_requested_.store(true);
      break;
    case SupervisorCommand::kStop:
      stop_deadline_s_.store(command.stop().deadline_s());
      stop_requested_.store(true);
      break;
    case SupervisorCommand::BODY_NOT_SET:
      break;
  }
}

WorkerMessage SupervisorLink::MakeHello() const {
  WorkerMessage message;
  auto* hello = message.mutable_hello();
  hello->set_run_id(options_.run_id);
  hello->set_rank(options_.rank);
  hello->set_attempt(options_.attempt);
  hello->set_pid(static_cast<int32_t>(::getpid()));
  hello->set_token(options_.token);
  hello->set_world_size(options_.world_size);
  hello->set_version(options_.version.empty() ? std::string(Version()) : options_.version);
  return message;
}

WorkerMessage SupervisorLink::MakeHeartbeat() {
  WorkerMessage message;
  auto* heartbeat = message.mutable_heartbeat();
  heartbeat->set_seq(++heartbeat_seq_);
  heartbeat->set_progress_counter(progress_counter_.load());
  *heartbeat->mutable_progress() = progress_;
  heartbeat->mutable_progress()->set_time_ms(UnixMillis());
  return message;
}

}  // namespace trainsup::worker
