// The node's slots (one per GPU, else cpu_slots) and the release check that
// runs before a slot is used again (docs/design.md, Slots and GPUs): the facts
// (the dead worker's process group, the GPU query) are gathered off the
// loop, the decision is slot_release.h's, and only groups that still are
// the worker's (group_identity.h) are ever signalled. The GPU query's last
// answer is cached for GetNode, so the API never waits on NVML.
#ifndef TRAINSUP_SUPERVISOR_SYS_SLOTS_H_
#define TRAINSUP_SUPERVISOR_SYS_SLOTS_H_

#include <boost/asio.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/policy/group_identity.h"
#include "supervisor/policy/scheduler.h"
#include "supervisor/policy/slot_release.h"
#include "supervisor/sys/gpu_monitor.h"
#include "trainsup/v1/supervisor.pb.h"

namespace trainsup::supervisor {

enum class SlotState { kFree, kBusy, kReleasing, kStranded };
// "FREE", "BUSY", "RELEASING", "STRANDED".
std::string ToString(SlotState state);
v1::SlotState ToProto(SlotState state);

// Why a slot takes no new rank (docs/distributed.md, "Elastic"): an
// operator said so (trainctl drain; stored), its GPU is unhealthy
// (GpuHealthProblem: lost, uncorrectable ECC, pending page retirement, an
// Xid that needs a reset; it ends when the GPU is healthy again), or it
// stayed STRANDED past slots.drain_stranded_after_s (it ends when the
// memory is released).
struct SlotDrain {
  std::string reason;
  std::string source;  // kDrainOperator, kDrainGpuHealth, kDrainStranded
  int64_t since_ms = 0;
  // A health drain for an Xid event: NVML reports the event once, so the
  // next query finds the GPU "healthy" whether it was reset or not. Such a
  // drain stays until an operator undrains the slot (after the reset).
  bool sticky = false;
};
inline constexpr char kDrainOperator[] = "operator";
inline constexpr char kDrainGpuHealth[] = "gpu_health";
inline constexpr char kDrainStranded[] = "stranded";

struct Slot {
  int index = 0;
  int gpu_index = -1;  // -1: a CPU slot
  std::string gpu_uuid;
  std::string name;  // "gpu:N" (N = gpu_index) or "cpu:N"
  std::optional<SlotDrain> drain;
  double stranded_since_s = 0;
  SlotState state = SlotState::kFree;
  std::string run_id;
  int rank = -1;
  GroupIdentity group;           // the last worker's
  double release_started_s = 0;  // when its worker ended (Release)
  double release_deadline_s = 0;
  std::string reason;
};

class SlotTable {
 public:
  struct Hooks {
    std::function<double()> now;
    std::function<void(std::function<void()>)> off_loop;  // runs work on the pool
    std::function<void(std::function<void()>)> post;      // runs fn on the loop
    // A slot became free: the scheduler may place a run.
    std::function<void()> freed;
    // A slot was stranded (run_id may name a finished run).
    std::function<void(const Slot& slot)> stranded;
    std::function<void(const std::string& line)> log;
    std::function<int64_t()> wall_ms;
    // The table drained a slot itself (its GPU's health, or stranded too
    // long), or ended such a drain (`why`: what changed).
    std::function<void(const Slot& slot)> drained;
    std::function<void(const Slot& slot, const std::string& why)> undrained;
  };
  SlotTable(std::unique_ptr<GpuMonitor> gpus, int cpu_slots, Hooks hooks);

  const std::vector<Slot>& slots() const { return slots_; }
  bool gpu_slots() const { return !slots_.empty() && slots_[0].gpu_index >= 0; }
  bool nvml() const { return gpus_ && gpus_->available(); }
  std::vector<SlotView> Views() const;
  // CUDA_VISIBLE_DEVICES of a slot ("" on a CPU slot).
  std::string VisibleDevices(int slot) const;

  // The slot named "gpu:N", "cpu:N" or by its index; -1 when none is.
  int Find(const std::string& name) const;
  // How the store keys an operator's drain of `slot`: the GPU's UUID (its
  // index may change across reboots), else the slot's name.
  std::string DrainKey(int slot) const;
  // Drains `slot` (replacing an earlier drain) or ends its drain. A drained
  // slot keeps its rank until the rank ends, then takes no new one; after an
  // undrain the caller reschedules (no hook runs).
  void Drain(int slot, SlotDrain drain);
  void Undrain(int slot);
  // Whether an operator may undrain `slot`: drained by an operator, or by
  // an Xid (sticky) whose GPU reports no other problem now. The reason
  // when not.
  std::string UndrainRefusal(int slot) const;
  // A slot STRANDED this long is drained (kDrainStranded); 0: never.
  void set_drain_stranded_after_s(double s) { drain_stranded_after_s_ = s; }

  void Assign(int slot, const std::string& run_id, int rank);
  // The worker on `slot` ended: its group must be gone (and its GPU
  // released) before the slot is free again; checked now and on every Tick.
  void Release(int slot, const GroupIdentity& group, double timeout_s, int64_t idle_bytes);
  // Re-checks releasing and stranded slots (one check in flight at a time)
  // and refreshes the GPU cache every `gpu_refresh_s`.
  void Tick(int64_t idle_bytes);
  // The cached GPU query (empty before the first answer).
  const std::vector<GpuInfo>& gpus() const { return gpu_cache_; }

 private:
  struct Facts;
  void StartCheck(int64_t idle_bytes);
  // Off the loop: for each (slot, group) target, whether its process group
  // is still the worker's and, if so, its members' pids. One Facts per
  // target, in order.
  static std::vector<Facts> GatherFacts(const std::vector<std::pair<int, GroupIdentity>>& targets);
  // On the loop, ending the check StartCheck began: `queried` says a GPU
  // query was made (`answer`, or `error` when it failed); caches the answer,
  // judges each slot in `facts`, runs hooks_.freed once if any slot was
  // freed, and starts the check asked for meanwhile.
  void FinishCheck(const std::vector<Facts>& facts,
                   const std::optional<std::vector<GpuInfo>>& answer, const std::string& error,
                   int64_t idle_bytes, bool queried);
  // One slot's release from its facts, unless the slot moved on since they
  // were gathered or its GPU had no answer this round (`seen`: the GPUs
  // the query listed, empty when it failed; unset when none was made).
  // Returns whether the slot was freed.
  bool JudgeRelease(const Facts& f, const std::optional<std::vector<GpuInfo>>& seen,
                    const std::string& error, int64_t idle_bytes, bool queried);
  // Carries out decision `d` on checking slot `s`: the kills it asks for,
  // then frees, strands (draining it once stranded too long) or keeps
  // waiting. Returns whether the slot was freed.
  bool ApplyRelease(Slot& s, const ReleaseDecision& d);
  // After a GPU query: drains a slot whose GPU has a health problem, and
  // ends the health drain of one whose GPU has none any more.
  void JudgeGpuHealth(const std::vector<GpuInfo>& gpus);
  // Before a new answer replaces the cache: a health query that failed
  // (GpuInfo::health_error) is logged when it starts, changes or ends
  // against the cached answer, not at every query.
  void LogHealthErrors(const std::vector<GpuInfo>& gpus) const;
  // The table's own drains (not an operator's): set or ended.
  void DrainFor(Slot& s, const std::string& source, const std::string& reason);
  void EndDrainFor(Slot& s, const std::string& source, const std::string& why);

  std::shared_ptr<GpuMonitor> gpus_;
  std::vector<Slot> slots_;
  Hooks hooks_;
  bool check_in_flight_ = false;
  bool check_again_ = false;
  std::vector<GpuInfo> gpu_cache_;
  double gpu_refreshed_s_ = -1e9;
  double drain_stranded_after_s_ = 0;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_SYS_SLOTS_H_
