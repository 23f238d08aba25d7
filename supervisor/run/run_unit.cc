// The run unit's record: its state and the run's, the store writes that
// persist them (retried with backoff), and the events it publishes. Its
// life's other jobs each have a file: run_unit_launch.cc (starting an
// attempt), run_unit_link.cc (the worker channel and liveness),
// run_unit_end.cc (exit to restart), run_unit_stop.cc (stops),
// run_unit_adopt.cc (after a daemon restart), run_unit_guard.cc
// (rollbacks), run_unit_elastic.cc (resizes), run_unit_cluster.cc
// (multi-node jobs).
#include "supervisor/run/run_unit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainsup::supervisor {
namespace {

// A failed store write is retried after 0.25 s, doubling up to this.
constexpr double kMaxStoreRetryS = 30;

}  // namespace

bool IsTerminal(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED;
}

v1::ExitClass ExitClassProto(ExitClass cls) { return static_cast<v1::ExitClass>(ToProto(cls)); }

v1::TrainingTally TallyToProto(const TrainingTally& t) {
  v1::TrainingTally p;
  p.set_steps(t.steps);
  p.set_applied(t.applied);
  p.set_skipped_window(t.skipped_window);
  p.set_skipped_guard(t.skipped_guard);
  p.set_skipped_scaler(t.skipped_scaler);
  p.set_final_metric(t.final_metric);
  p.set_baseline_metric(t.baseline_metric);
  return p;
}

TrainingTally TallyFromProto(const v1::TrainingTally& p) {
  TrainingTally t;
  t.steps = p.steps();
  t.applied = p.applied();
  t.skipped_window = p.skipped_window();
  t.skipped_guard = p.skipped_guard();
  t.skipped_scaler = p.skipped_scaler();
  t.final_metric = p.final_metric();
  t.baseline_metric = p.baseline_metric();
  return t;
}

std::string StateName(v1::RunState s) {
  std::string name = v1::RunState_Name(s);
  return name.substr(std::string("RUN_STATE_").size());
}

RunUnit::RunUnit(UnitEnv env) : env_(env) {}

RunUnit::RunUnit(v1::Run run, RunSpec spec, int64_t seq, UnitEnv env)
    : env_(env), run_(std::move(run)), spec_(std::move(spec)), seq_(seq) {
  run_.clear_attempts();
}

RunUnit::~RunUnit() {
  FailCheckpointRequests(-1, "the daemon let go of the run before a checkpoint committed");
  life_.reset();
  if (restart_timer_ != 0) env_.timers->Cancel(restart_timer_);
  for (RankState& r : ranks_) {
    if (r.stop_timer != 0) env_.timers->Cancel(r.stop_timer);
  }
}

// --- the record: state, store writes, events ----------------------------------------

void RunUnit::Log(LogLevel level, const std::string& line) {
  env_.host->Log(level, absl::StrCat("run=", id(), " ", line));
}

v1::RunEvent RunUnit::Event(v1::EventKind kind, int rank, const std::string& reason) const {
  v1::RunEvent e;
  e.set_run_id(id());
  e.set_time_ms(env_.clock->WallMs());
  e.set_attempt(attempt_.number());
  e.set_state(run_.state());
  e.set_kind(kind);
  e.set_rank(rank);
  e.set_reason(reason);
  return e;
}

bool RunUnit::AnyAlive() const {
  for (const RankState& r : ranks_) {
    if (r.alive) return true;
  }
  return false;
}

void RunUnit::Persist(StoreBatch batch, std::function<void(const StoreBatch&)> then) {
  // A progress snapshot still waiting behind the write in flight is
  // replaced by a newer one.
  if (batch.coalescible && writes_.size() >= 2 && writes_.back().batch.coalescible) {
    writes_.back() = PendingWrite{std::move(batch), std::move(then)};
    return;
  }
  writes_.push_back(PendingWrite{std::move(batch), std::move(then)});
  PumpWrites();
}

void RunUnit::PumpWrites() {
  if (write_in_flight_ || writes_.empty()) return;
  write_in_flight_ = true;
  env_.store->Write(
      id(), writes_.front().batch, Guarded([this](absl::Status status, StoreBatch stored) {
        if (!status.ok()) {
          ++write_failures_;
          env_.host->StoreFailed(id(), writes_.front().batch.what, status);
          const double delay =
              std::min(kMaxStoreRetryS, 0.25 * std::pow(2.0, std::min(write_failures_ - 1, 16)));
          // The queue stays held until the retry.
          env_.timers->Start(delay, Guarded([this] {
                               write_in_flight_ = false;
                               PumpWrites();
                             }));
          return;
        }
        write_in_flight_ = false;
        write_failures_ = 0;
        PendingWrite done = std::move(writes_.front());
        writes_.pop_front();
        if (done.then) done.then(stored);
        PumpWrites();
        MaybeFinished();
        if (writes_.empty()) env_.host->Reschedule();
      }));
}

void RunUnit::PublishAll(const StoreBatch& batch) {
  for (const v1::RunEvent& e : batch.events) env_.host->Publish(e);
}

void RunUnit::SetState(v1::RunState state, const std::string& reason, StoreBatch extra,
                       std::function<void()> then) {
  const v1::RunState old = run_.state();
  run_.set_state(state);
  run_.set_reason(reason);
  run_.set_updated_ms(env_.clock->WallMs());
  if ((state == v1::RUN_STATE_PENDING || state == v1::RUN_STATE_RESTARTING) && state != old) {
    queued_since_s_ = env_.clock->NowS();
  }
  if (IsTerminal(state)) {
    run_.set_ended_ms(env_.clock->WallMs());
    run_.clear_stop_request();
  }
  v1::RunEvent ev = Event(v1::EVENT_KIND_STATE, -1, reason);
  extra.events.push_back(ev);
  extra.run = run_;
  if (extra.what.empty()) extra.what = absl::StrCat("state ", StateName(state));
  Log(LogLevel::kInfo, absl::StrCat(StateName(old), " -> ", StateName(state), ": ", reason));
  Persist(std::move(extra), [this, then](const StoreBatch& stored) {
    PublishAll(stored);
    ReportToCluster();
    if (then) then();
  });
}

StoreBatch::Rank RunUnit::RankRow(RankState& r) {
  r.status.set_rank(r.rank);
  r.status.set_pid(r.pid);
  r.status.set_slot(r.slot);
  r.status.set_gpu(r.gpu);
  r.status.set_alive(r.alive);
  r.last_persist_s = env_.clock->NowS();
  StoreBatch::Rank row;
  row.attempt = attempt_.number();
  row.status = r.status;
  row.priv = RankPrivate{r.group.pgid, r.group.leader_start_ticks, r.token};
  return row;
}

void RunUnit::MaybeFinished() {
  if (finished_ || !IsTerminal(run_.state()) || AnyAlive() || write_in_flight_ ||
      !writes_.empty()) {
    return;
  }
  finished_ = true;
  env_.host->Finished(id());
}

}  // namespace trainsup::supervisor
