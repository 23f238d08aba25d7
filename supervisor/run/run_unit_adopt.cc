// A run restored from the store after a daemon restart, and its ranks
// adopted: the live ones reconnect, the dead ones are classified from their
// exit files (docs/supervisor.md, "Adoption").
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "supervisor/policy/run_history.h"
#include "supervisor/run/run_unit.h"

namespace trainsup::supervisor {
namespace {

// The least time an adopted worker has to reconnect after a daemon restart:
// its reconnect backoff grows to 5 s while no daemon answers.
constexpr double kAdoptReconnectS = 10;

}  // namespace

std::unique_ptr<RunUnit> RunUnit::Restore(const v1::Run& stored, RunSpec spec, int64_t seq,
                                          const std::vector<RankPrivate>& privs,
                                          const RunLearning& learning, UnitEnv env) {
  std::unique_ptr<RunUnit> u(new RunUnit(env));
  u->run_ = stored;
  u->run_.clear_attempts();
  u->spec_ = std::move(spec);
  u->seq_ = seq;
  u->learning_.slowest_step_s = learning.slowest_step_s;
  u->learning_.steps_observed = learning.steps_observed;
  RunHistory h = RebuildHistory(stored);
  u->history_ = std::move(h.ends);
  u->oom_exits_ = h.oom_exits;
  if (stored.attempts_size() > 0) {
    u->attempt_ = *stored.attempts().rbegin();
    u->attempt_.clear_ranks();
  }
  const bool open_attempt =
      stored.attempts_size() > 0 && stored.attempts().rbegin()->ended_ms() == 0;
  if (stored.stop_request().kind() == v1::StopRequest::KIND_CANCEL && !IsTerminal(stored.state()) &&
      !open_attempt) {
    // Cancelled (and answered OK) while its attempt was being prepared or
    // it waited; no rank to wait for.
    u->cancel_ = true;
    u->cancel_reason_ = stored.stop_request().reason();
    u->SetState(v1::RUN_STATE_CANCELLED, u->cancel_reason_, {},
                [raw = u.get()] { raw->MaybeFinished(); });
    return u;
  }
  switch (stored.state()) {
    case v1::RUN_STATE_STARTING:
    case v1::RUN_STATE_RUNNING:
      if (open_attempt) {
        u->Adopt(*stored.attempts().rbegin(), privs);
      } else {
        u->SetState(v1::RUN_STATE_PENDING, "daemon restarted before the attempt started", {});
      }
      break;
    case v1::RUN_STATE_RESTARTING: {
      const double delay =
          std::max<double>(0, (stored.next_restart_ms() - env.clock->WallMs()) / 1000.0);
      u->not_before_s_ = env.clock->NowS() + delay;
      RunUnit* raw = u.get();
      if (!u->history_.empty() && u->history_.back().cls == ExitClass::kNoSpace) {
        u->waiting_for_space_ = true;
        u->space_backoff_s_ = std::max(delay, 1.0);
        u->restart_timer_ = env.timers->Start(delay, u->Guarded([raw] {
          raw->restart_timer_ = 0;
          raw->WaitForSpace();
        }));
      } else {
        u->restart_timer_ = env.timers->Start(delay, u->Guarded([raw] {
          raw->restart_timer_ = 0;
          raw->env_.host->Reschedule();
        }));
      }
      break;
    }
    default:
      break;
  }
  return u;
}

void RunUnit::Adopt(const v1::Attempt& a, const std::vector<RankPrivate>& privs) {
  const double now = env_.clock->NowS();
  rank_base_ = a.ranks_size() > 0 ? a.ranks(0).rank() : 0;
  int adopted = 0;
  std::vector<int> died;
  for (int i = 0; i < a.ranks_size(); ++i) {
    const v1::RankStatus& rs = a.ranks(i);
    RankState r;
    r.rank = rs.rank();
    r.slot = rs.slot();
    r.gpu = rs.gpu();
    r.pid = rs.pid();
    r.status = rs;
    r.launched_s = now;
    if (i < static_cast<int>(privs.size())) {
      r.group.pgid = privs[i].pgid;
      r.group.leader_start_ticks = privs[i].start_ticks;
      r.token = privs[i].token;
    }
    r.own_child = false;
    r.alive =
        rs.alive() && r.pid > 0 && env_.launcher->IsSameProcess(r.pid, r.group.leader_start_ticks);
    r.group.known_alive_ticks = env_.clock->BootTicks();
    if (!r.alive && rs.alive()) {
      // Died while no daemon was watching: classified from its exit file.
      r.died_unwatched = true;
      r.group.known_alive_ticks =
          rs.last_heartbeat_ms() > 0 ? env_.clock->BootTicksAt(rs.last_heartbeat_ms()) : 0;
      r.alive = true;
      died.push_back(r.rank);
    } else if (r.alive) {
      adopted++;
    }
    // A fresh heartbeat timeout to reconnect in, at least kAdoptReconnectS.
    r.last_heartbeat_s = now + std::max(0.0, kAdoptReconnectS - cfg().workers.heartbeat_timeout_s);
    r.last_progress_s = now;
    r.heard = true;
    r.progressed = true;
    ranks_.push_back(std::move(r));
    slots_.push_back(ranks_.back().slot);
  }
  const std::string note = absl::StrCat("daemon restarted: adopted ", adopted, " of ",
                                        a.ranks_size(), " workers of attempt ", a.number());
  Log(LogLevel::kInfo, note);
  StoreBatch b;
  b.what = "adoption";
  b.events.push_back(Event(v1::EVENT_KIND_LOG, -1, note));
  Persist(std::move(b), [this](const StoreBatch& stored) { PublishAll(stored); });
  const int number = a.number();
  for (RankState& r : ranks_) {
    if (r.alive && !r.died_unwatched) {
      env_.launcher->WatchExit(id(), number, r.rank, r.pid, r.group.leader_start_ticks, false);
    }
  }
  HonourStoredStop(number);
  for (int rank : died) {
    env_.timers->Start(0, Guarded([this, number, rank] { OnProcessExit(number, rank); }));
  }
  if (Clustered() && EnsureCluster()) {
    // Not adopted: while no daemon held this node's lease the job may have
    // moved on without it, and its peers may be gone. The job restarts
    // together (the generation moves when they end).
    for (RankState& r : ranks_) {
      if (r.alive && !r.died_unwatched) {
        StopRank(r, ExitClass::kGang,
                 "daemon restarted: the ranks of a multi-node attempt are not adopted; the job "
                 "restarts together",
                 /*graceful=*/false);
      }
    }
  }
  if (!AnyAlive()) env_.timers->Start(0, Guarded([this] { EndAttempt(); }));
}

}  // namespace trainsup::supervisor
