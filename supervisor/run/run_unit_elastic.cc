// Elastic gangs in the run unit (docs/distributed.md, "Elastic"): the
// size of the running gang, a queued run's note of why it waits, and a
// resize (a graceful stop of the gang, queued again at once).
#include "absl/strings/str_cat.h"
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

void RunUnit::Resize(const std::string& reason) {
  if (IsTerminal(run_.state()) || cancel_ || shutdown_stop_) return;
  resize_reason_ = reason;
  if (!AnyAlive() || resize_stop_) return;
  resize_stop_ = true;
  Log(LogLevel::kInfo, absl::StrCat("resizing the gang: ", reason));
  for (RankState& r : ranks_) {
    if (r.alive) StopRank(r, ExitClass::kStopped, "resizing the gang: " + reason, true);
  }
}

}  // namespace trainsup::supervisor
