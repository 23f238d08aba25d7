// Placing queued runs on slots (GPUs, or CPU slots), as a pure function:
// the daemon passes its queue and slot states and applies the placements.
#ifndef TRAINSUP_SUPERVISOR_POLICY_SCHEDULER_H_
#define TRAINSUP_SUPERVISOR_POLICY_SCHEDULER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace trainsup::supervisor {

struct SlotView {
  int index = 0;
  bool free = false;  // idle and healthy: not busy, releasing or stranded
};

struct QueuedRun {
  std::string run_id;
  int priority = 0;         // higher goes first
  int64_t seq = 0;          // submit order: lower goes first within a priority
  int world_size = 1;       // slots the gang needs, all at once
  double not_before_s = 0;  // in backoff: not eligible before this time
};

struct Placement {
  std::string run_id;
  std::vector<int> slots;  // ascending slot indices, world_size of them
};

// Places runs in order of priority (highest first), then seq (lowest first).
// An eligible run is placed on the lowest-numbered free slots once
// world_size of them are free; no slot is given out twice. Head-of-line
// blocking: the first eligible run that does not fit stops the pass, so
// the runs behind it (of lower or equal priority) cannot overtake it and big
// gangs are not starved. Skipped without blocking: runs in backoff
// (not_before_s > now_s), and runs that can never fit (world_size < 1 or
// more than slots.size(); the caller fails those). Placements come in the
// order they were made.
std::vector<Placement> Schedule(std::vector<QueuedRun> queue, const std::vector<SlotView>& slots,
                                double now_s);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_SCHEDULER_H_
