// The node's slots (one per GPU, else cpu_slots) and the release check that
// runs before a slot is used again (DESIGN.md, Slots and GPUs): the facts
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
#include "supervisor/sys/gpu_monitor.h"
#include "trainsup/v1/supervisor.pb.h"

namespace trainsup::supervisor {

enum class SlotState { kFree, kBusy, kReleasing, kStranded };
// "FREE", "BUSY", "RELEASING", "STRANDED".
std::string ToString(SlotState state);
v1::SlotState ToProto(SlotState state);

struct Slot {
  int index = 0;
  int gpu_index = -1;  // -1: a CPU slot
  std::string gpu_uuid;
  SlotState state = SlotState::kFree;
  std::string run_id;
  int rank = -1;
  GroupIdentity group;  // the last worker's
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
  };
  SlotTable(std::unique_ptr<GpuMonitor> gpus, int cpu_slots, Hooks hooks);

  const std::vector<Slot>& slots() const { return slots_; }
  bool gpu_slots() const { return !slots_.empty() && slots_[0].gpu_index >= 0; }
  bool nvml() const { return gpus_ && gpus_->available(); }
  std::vector<SlotView> Views() const;
  // CUDA_VISIBLE_DEVICES of a slot ("" on a CPU slot).
  std::string VisibleDevices(int slot) const;

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

  std::shared_ptr<GpuMonitor> gpus_;
  std::vector<Slot> slots_;
  Hooks hooks_;
  bool check_in_flight_ = false;
  bool check_again_ = false;
  std::vector<GpuInfo> gpu_cache_;
  double gpu_refreshed_s_ = -1e9;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_SYS_SLOTS_H_
