// Elastic gangs in the run unit (docs/distributed.md, "Elastic"): the
// size of the running gang, a queued run's note of why it waits, and a
// resize (a graceful stop of the gang, queued again at once).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {

int RunUnit::running_world_size() const {
  if (run_.state() != v1::RUN_STATE_RUNNING && run_.state() != v1::RUN_STATE_STARTING) return 0;
  return attempt_.world_size() > 0 ? attempt_.world_size() : static_cast<int>(ranks_.size());
}

std::optional<QueuedRun> RunUnit::Queued() const {
  const v1::RunState s = run_.state();
  if (s != v1::RUN_STATE_PENDING && s != v1::RUN_STATE_RESTARTING) return std::nullopt;
  if (preparing_ || launching_ || joining_ || cancel_ || waiting_for_space_ || write_in_flight_ ||
      !writes_.empty() || AnyAlive()) {
    return std::nullopt;
  }
  QueuedRun q{id(),         run_.priority(), seq_,
              LocalRanks(), not_before_s_,   Clustered() ? spec_.cluster.job : std::string()};
  if (!Clustered()) {
    q.min_world_size = static_cast<int>(spec_.min_world_size);
    q.shrink_at_s = std::max(not_before_s_, queued_since_s_) + spec_.elastic.wait_s;
  }
  return q;
}

void RunUnit::AddResizeEvent(StoreBatch& b, int previous, int world) {
  if (previous > 0 && previous != world) {
    std::string why = resize_reason_;
    if (why.empty()) {
      why = world < previous ? "fewer slots were free" : "slots came back";
    }
    b.events.push_back(Event(v1::EVENT_KIND_RESIZE, -1,
                             absl::StrCat("world size ", previous, " \u2192 ", world, ": ", why)));
    env_.host->CountResize(id(), world > previous ? "grow" : "shrink");
  }
  resize_reason_.clear();
}

void RunUnit::RequeueNow(StoreBatch b, const std::string& reason) {
  not_before_s_ = env_.clock->NowS();
  SetState(v1::RUN_STATE_RESTARTING, reason, std::move(b), [this] { env_.host->Reschedule(); });
}

void RunUnit::NoteWaiting(const std::string& why) {
  if (!Queued() || run_.reason() == why) return;
  SetState(run_.state(), why, {});
}

void RunUnit::NoteBlocked(const std::string& why) {
  if (why.empty()) {
    if (blocked_since_s_ < 0) return;
    const std::string line =
        absl::StrCat("no longer blocked after ", absl::StrFormat("%.0f", blocked_s()),
                     " s: enough slots are usable again");
    blocked_since_s_ = -1;
    blocked_why_.clear();
    StoreBatch b;
    b.what = "unblocked";
    b.events.push_back(Event(v1::EVENT_KIND_BLOCKED, -1, line));
    Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
    return;
  }
  if (blocked_since_s_ < 0) {
    blocked_since_s_ = env_.clock->NowS();
    const double max = spec_.elastic.max_blocked_s;
    const std::string line = absl::StrCat(
        why, max > 0 ? absl::StrCat("; fails after ", absl::StrFormat("%.0f", max), " s blocked")
                     : std::string("; waits until they come back (elastic.max_blocked_s = 0)"));
    Log(LogLevel::kWarn, line);
    StoreBatch b;
    b.what = "blocked";
    b.events.push_back(Event(v1::EVENT_KIND_BLOCKED, -1, line));
    Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
  }
  blocked_why_ = why;
  NoteWaiting(why);
  CheckBlocked();
}

double RunUnit::blocked_s() const {
  return blocked_since_s_ < 0 ? 0 : env_.clock->NowS() - blocked_since_s_;
}

void RunUnit::CheckBlocked() {
  const double max = spec_.elastic.max_blocked_s;
  if (blocked_since_s_ < 0 || max <= 0 || blocked_s() < max || !Queued()) return;
  const std::string why =
      absl::StrCat("blocked for ", absl::StrFormat("%.0f", blocked_s()),
                   " s (elastic.max_blocked_s = ", absl::StrFormat("%g", max), "): ", blocked_why_);
  blocked_since_s_ = -1;
  if (restart_timer_ != 0) env_.timers->Cancel(restart_timer_);
  restart_timer_ = 0;
  SetState(v1::RUN_STATE_FAILED, why, {}, [this] { MaybeFinished(); });
}

void RunUnit::Resize(const std::string& reason) {
  if (IsTerminal(run_.state()) || cancel_ || shutdown_stop_ || resize_stop_) return;
  if (!AnyAlive()) {
    // Placed but no rank runs yet: the start is abandoned once the
    // attempt is prepared (StoppedBeforeStart) or, stored already, at
    // launch (LaunchRanks). A queued run holds no slot: nothing to do.
    if (preparing_ || launching_ || joining_) resize_before_start_ = reason;
    return;
  }
  resize_reason_ = reason;
  resize_stop_ = true;
  Log(LogLevel::kInfo, absl::StrCat("resizing the gang: ", reason));
  RequestStop(v1::StopRequest::KIND_RESIZE, reason, ExitClass::kStopped,
              absl::StrCat("resizing the gang: ", reason), nullptr);
}

}  // namespace trainsup::supervisor
