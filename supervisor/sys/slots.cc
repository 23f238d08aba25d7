#include "supervisor/sys/slots.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "supervisor/policy/slot_release.h"
#include "supervisor/sys/process.h"

namespace trainsup::supervisor {
namespace {

// The GPU cache behind GetNode is refreshed this often.
constexpr double kGpuRefreshS = 1.0;

bool Checking(SlotState s) { return s == SlotState::kReleasing || s == SlotState::kStranded; }

// Off the loop: asks `gpus` for the GPUs (nothing when null); sets *answer,
// or *error when the query failed.
void QueryGpus(const std::shared_ptr<GpuMonitor>& gpus, std::optional<std::vector<GpuInfo>>* answer,
               std::string* error) {
  if (gpus) {
    absl::StatusOr<std::vector<GpuInfo>> q = gpus->Query();
    if (q.ok()) {
      *answer = std::move(*q);
    } else {
      *error = std::string(q.status().message());
    }
  }
}

}  // namespace

std::string ToString(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "FREE";
    case SlotState::kBusy:
      return "BUSY";
    case SlotState::kReleasing:
      return "RELEASING";
    case SlotState::kStranded:
      return "STRANDED";
  }
  return "UNKNOWN";
}

v1::SlotState ToProto(SlotState s) {
  switch (s) {
    case SlotState::kFree:
      return v1::SLOT_STATE_FREE;
    case SlotState::kBusy:
      return v1::SLOT_STATE_BUSY;
    case SlotState::kReleasing:
      return v1::SLOT_STATE_RELEASING;
    case SlotState::kStranded:
      return v1::SLOT_STATE_STRANDED;
  }
  return v1::SLOT_STATE_UNSPECIFIED;
}

struct SlotTable::Facts {
  int slot = 0;
  int pgid = 0;
  GroupOwnership ownership = GroupOwnership::kGone;
  std::vector<int> members;
};

SlotTable::SlotTable(std::unique_ptr<GpuMonitor> gpus, int cpu_slots, Hooks hooks)
    : gpus_(std::move(gpus)), hooks_(std::move(hooks)) {
  if (gpus_ && gpus_->available()) {
    // Start-up: the one GPU query made on the loop's thread.
    absl::StatusOr<std::vector<GpuInfo>> found = gpus_->Query();
    if (found.ok()) {
      for (const GpuInfo& g : *found) {
        Slot s;
        s.index = static_cast<int>(slots_.size());
        s.gpu_index = g.index;
        s.gpu_uuid = g.uuid;
        s.name = absl::StrCat("gpu:", g.index);
        slots_.push_back(s);
      }
      LogHealthErrors(*found);
      gpu_cache_ = *found;
      gpu_refreshed_s_ = hooks_.now();
      // A GPU that is unhealthy now is drained before any rank is placed.
      JudgeGpuHealth(*found);
    } else {
      hooks_.log(absl::StrCat("GPU query failed, using CPU slots: ", found.status().message()));
    }
  }
  if (slots_.empty()) {
    for (int i = 0; i < cpu_slots; ++i) {
      Slot s;
      s.index = i;
      s.name = absl::StrCat("cpu:", i);
      slots_.push_back(s);
    }
  }
}

std::vector<SlotView> SlotTable::Views() const {
  std::vector<SlotView> views;
  for (const Slot& s : slots_) {
    views.push_back({s.index, s.state == SlotState::kFree && !s.drain, !s.drain});
  }
  return views;
}

int SlotTable::Find(const std::string& name) const {
  for (const Slot& s : slots_) {
    if (s.name == name || std::to_string(s.index) == name) return s.index;
  }
  return -1;
}

std::string SlotTable::DrainKey(int slot) const {
  const Slot& s = slots_[slot];
  return s.gpu_uuid.empty() ? s.name : s.gpu_uuid;
}

void SlotTable::Drain(int slot, SlotDrain drain) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) return;
  slots_[slot].drain = std::move(drain);
}

void SlotTable::Undrain(int slot) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) return;
  slots_[slot].drain.reset();  // the caller reschedules (Daemon::OnSlotUndrained)
}

std::string SlotTable::UndrainRefusal(int slot) const {
  const Slot& s = slots_[slot];
  if (!s.drain) return absl::StrCat("slot ", s.name, " is not drained");
  if (s.drain->source == kDrainOperator) return "";
  if (s.drain->sticky) {
    for (const GpuInfo& g : gpu_cache_) {
      if (g.index != s.gpu_index) continue;
      const std::string problem = GpuHealthProblem(g);
      if (problem.empty() || problem.rfind("Xid ", 0) == 0) return "";
      return absl::StrCat("slot ", s.name, "'s GPU still reports ", problem);
    }
  }
  return absl::StrCat("slot ", s.name, " is drained by trainsupd (", s.drain->source, ": ",
                      s.drain->reason, "); it is offered again when that clears");
}

void SlotTable::DrainFor(Slot& s, const std::string& source, const std::string& reason) {
  if (s.drain && s.drain->source == kDrainOperator) return;  // the operator's stays
  if (s.drain && s.drain->source == source) {
    s.drain->reason = reason;
    return;
  }
  s.drain = SlotDrain{reason, source, hooks_.wall_ms ? hooks_.wall_ms() : 0};
  hooks_.log(absl::StrCat("slot ", s.name, " drained: ", reason));
  if (hooks_.drained) hooks_.drained(s);
}

void SlotTable::EndDrainFor(Slot& s, const std::string& source, const std::string& why) {
  if (!s.drain || s.drain->source != source) return;
  const Slot before = s;
  s.drain.reset();
  hooks_.log(absl::StrCat("slot ", s.name, " offered again: ", why));
  if (hooks_.undrained) hooks_.undrained(before, why);
}

void SlotTable::LogHealthErrors(const std::vector<GpuInfo>& gpus) const {
  for (const GpuInfo& g : gpus) {
    std::string before;  // the previous answer's, still in the cache
    for (const GpuInfo& old : gpu_cache_) {
      if (old.index == g.index) before = old.health_error;
    }
    if (g.health_error == before) continue;
    hooks_.log(g.health_error.empty()
                   ? absl::StrCat("GPU ", g.index, ": its health queries answer again")
                   : absl::StrCat("GPU ", g.index, ": a health query failed (", g.health_error,
                                  "); its health is judged by the facts that were read"));
  }
}

void SlotTable::JudgeGpuHealth(const std::vector<GpuInfo>& gpus) {
  for (Slot& s : slots_) {
    if (s.gpu_index < 0) continue;
    std::string problem = "lost (not listed by NVML)";
    for (const GpuInfo& g : gpus) {
      if (g.index == s.gpu_index) problem = GpuHealthProblem(g);
    }
    if (!problem.empty()) {
      const bool xid = problem.rfind("Xid ", 0) == 0;
      if (xid && s.drain && s.drain->source == kDrainGpuHealth) continue;  // keeps the first reason
      DrainFor(s, kDrainGpuHealth, absl::StrCat("GPU ", s.gpu_index, " ", problem));
      if (s.drain && s.drain->source == kDrainGpuHealth) s.drain->sticky = xid;
    } else if (!(s.drain && s.drain->sticky)) {
      EndDrainFor(s, kDrainGpuHealth, absl::StrCat("GPU ", s.gpu_index, " is healthy again"));
    }
  }
}

std::string SlotTable::VisibleDevices(int slot) const {
  const Slot& s = slots_[slot];
  if (s.gpu_index < 0) return "";
  return s.gpu_uuid.empty() ? std::to_string(s.gpu_index) : s.gpu_uuid;
}

void SlotTable::Assign(int slot, const std::string& run_id, int rank) {
  Slot& s = slots_[slot];
  s.state = SlotState::kBusy;
  s.run_id = run_id;
  s.rank = rank;
  s.reason.clear();
}

void SlotTable::Release(int slot, const GroupIdentity& group, double timeout_s,
                        int64_t idle_bytes) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) return;
  Slot& s = slots_[slot];
  s.state = SlotState::kReleasing;
  s.group = group;
  s.release_started_s = hooks_.now();
  s.release_deadline_s = s.release_started_s + timeout_s;
  StartCheck(idle_bytes);
}

void SlotTable::Tick(int64_t idle_bytes) {
  bool due = nvml() && hooks_.now() - gpu_refreshed_s_ >= kGpuRefreshS;
  for (const Slot& s : slots_) due = due || Checking(s.state);
  if (due) StartCheck(idle_bytes);
}

void SlotTable::StartCheck(int64_t idle_bytes) {
  if (check_in_flight_) {
    check_again_ = true;
    return;
  }
  check_in_flight_ = true;
  std::vector<std::pair<int, GroupIdentity>> targets;
  bool need_gpu = nvml() && hooks_.now() - gpu_refreshed_s_ >= kGpuRefreshS;
  for (const Slot& s : slots_) {
    if (!Checking(s.state)) continue;
    targets.emplace_back(s.index, s.group);
    need_gpu = need_gpu || (s.gpu_index >= 0 && nvml());
  }
  std::shared_ptr<GpuMonitor> gpus = need_gpu ? gpus_ : nullptr;
  hooks_.off_loop([this, targets, gpus, idle_bytes] {
    std::vector<Facts> facts = GatherFacts(targets);
    std::optional<std::vector<GpuInfo>> answer;
    std::string error;
    QueryGpus(gpus, &answer, &error);
    hooks_.post([this, facts, answer, error, idle_bytes, queried = gpus != nullptr] {
      FinishCheck(facts, answer, error, idle_bytes, queried);
    });
  });
}

std::vector<SlotTable::Facts> SlotTable::GatherFacts(
    const std::vector<std::pair<int, GroupIdentity>>& targets) {
  std::vector<Facts> facts;
  for (const auto& [slot, group] : targets) {
    Facts f;
    f.slot = slot;
    f.pgid = group.pgid;
    if (group.pgid > 1) {
      std::vector<GroupMember> members = ReadGroupMembers(group.pgid);
      f.ownership = JudgeGroup(group, members);
      if (f.ownership == GroupOwnership::kOurs) {
        for (const GroupMember& m : members) f.members.push_back(m.pid);
      }
    }
    facts.push_back(std::move(f));
  }
  return facts;
}

void SlotTable::FinishCheck(const std::vector<Facts>& facts,
                            const std::optional<std::vector<GpuInfo>>& answer,
                            const std::string& error, int64_t idle_bytes, bool queried) {
  check_in_flight_ = false;
  if (queried) {
    gpu_refreshed_s_ = hooks_.now();
    if (answer) {
      LogHealthErrors(*answer);
      gpu_cache_ = *answer;
      JudgeGpuHealth(*answer);
    }
  }
  std::optional<std::vector<GpuInfo>> seen = answer;
  if (queried && !answer) seen = std::vector<GpuInfo>{};
  bool freed = false;
  for (const Facts& f : facts) {
    freed = JudgeRelease(f, seen, error, idle_bytes, queried) || freed;
  }
  if (freed) hooks_.freed();
  if (check_again_) {
    check_again_ = false;
    StartCheck(idle_bytes);
  }
}

bool SlotTable::JudgeRelease(const Facts& f, const std::optional<std::vector<GpuInfo>>& seen,
                             const std::string& error, int64_t idle_bytes, bool queried) {
  Slot& s = slots_[f.slot];
  if (!Checking(s.state) || s.group.pgid != f.pgid) return false;
  if (f.ownership == GroupOwnership::kOurs) s.group.known_alive_ticks = BootTicksNow();
  ReleaseFacts rf;
  rf.our_group = f.members;
  rf.pgid = f.pgid;
  rf.gpu_checked = s.gpu_index >= 0 && queried;
  rf.gpu_index = s.gpu_index;
  rf.query_error = error;
  rf.idle_bytes = idle_bytes;
  rf.stranded = s.state == SlotState::kStranded;
  rf.past_deadline = hooks_.now() > s.release_deadline_s;
  if (seen) {
    for (const GpuInfo& g : *seen) {
      if (g.index == s.gpu_index) rf.gpu = g;
    }
  }
  if (s.gpu_index >= 0 && nvml() && !queried) return false;  // no answer this round
  return ApplyRelease(s, DecideRelease(rf));
}

bool SlotTable::ApplyRelease(Slot& s, const ReleaseDecision& d) {
  if (d.kill_group) SignalWorkerGroup(s.group, SIGKILL).IgnoreError();
  for (int pid : d.kill_holders) kill(pid, SIGKILL);
  switch (d.verdict) {
    case ReleaseDecision::kFree:
      if (s.state == SlotState::kStranded) hooks_.log(absl::StrCat("slot ", s.index, " recovered"));
      // How long a GPU takes to come back after its worker: the figure an
      // operator (and tests/gpu/e2e.sh) reads between exit and relaunch.
      if (s.gpu_index >= 0 && !d.reason.empty()) {
        hooks_.log(absl::StrFormat("slot %s free %.3f s after its worker ended: %s", s.name,
                                   hooks_.now() - s.release_started_s, d.reason));
      }
      EndDrainFor(s, kDrainStranded, "its memory was released");
      s = Slot{s.index, s.gpu_index, s.gpu_uuid, s.name, s.drain};
      return true;
    case ReleaseDecision::kStrand:
      if (s.state != SlotState::kStranded) {
        s.state = SlotState::kStranded;
        s.reason = d.reason;
        s.stranded_since_s = hooks_.now();
        hooks_.stranded(s);
      } else {
        s.reason = d.reason;
        if (drain_stranded_after_s_ > 0 &&
            hooks_.now() - s.stranded_since_s >= drain_stranded_after_s_) {
          DrainFor(
              s, kDrainStranded,
              absl::StrCat("stranded for more than ", drain_stranded_after_s_, " s: ", s.reason));
        }
      }
      return false;
    case ReleaseDecision::kWait:
      return false;
  }
  return false;
}

}  // namespace trainsup::supervisor
