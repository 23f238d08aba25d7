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
  bool free = false;   // idle and healthy: not busy, releasing, stranded or drained
  bool usable = true;  // not drained: free, or will be once its rank ends
};

struct QueuedRun {
  std::string run_id;
  int priority = 0;         // higher goes first
  int64_t seq = 0;          // submit order: lower goes first within a priority
  int world_size = 1;       // slots the gang wants, all at once
  double not_before_s = 0;  // in backoff: not eligible before this time
  std::string job;          // a multi-node run's job ("" for a local run)
  // An elastic gang (docs/distributed.md, "Elastic"): it may start with
  // min_world_size..world_size slots (0: world_size, not elastic), with
  // fewer than there are usable slots only from shrink_at_s on.
  int min_world_size = 0;
  double shrink_at_s = 0;
};

struct Placement {
  std::string run_id;
  std::vector<int> slots;  // ascending slot indices, world_size of them
};

// The queue's order: priority (highest first), then seq (lowest first),
// except that the runs of multi-node jobs of one priority take the places
// they hold among themselves in the order of their job names. Every node
// orders two jobs alike, whatever order they were submitted in there.
void OrderQueue(std::vector<QueuedRun>& queue);

// The fewest ranks `run` starts with: min_world_size (an elastic gang),
// else world_size.
int SmallestGang(const QueuedRun& run);

// Places runs in the queue's order (OrderQueue).
// An eligible run wants T = min(world_size, usable slots) slots. It is
// placed on the lowest-numbered free slots once T of them are free; an
// elastic run also on fewer, as many as are free, once at least
// min_world_size are free and now_s >= shrink_at_s. No slot is given out
// twice. Head-of-line blocking: the first eligible run that does not fit
// stops the pass, so the runs behind it (of lower or equal priority)
// cannot overtake it and big gangs are not starved. Skipped without
// blocking: runs in backoff (not_before_s > now_s), runs whose smallest
// gang needs more slots than are usable (drained slots must come back
// first), and runs that can never fit (world_size < 1 or more than
// slots.size(); the caller fails those). Placements come in the order they
// were made.
std::vector<Placement> Schedule(std::vector<QueuedRun> queue, const std::vector<SlotView>& slots,
                                double now_s);

// A multi-node run that holds its slots while it waits in its job's
// rendezvous (docs/distributed.md, "Competing jobs").
struct JoiningRun {
  std::string run_id;
  int priority = 0;
  std::string job;
  int slots = 0;          // the slots it holds
  double joined_s = 0;    // when it began to wait
  bool yielding = false;  // giving its slots back already: counted as free
};
struct Yield {
  std::string run_id;  // a JoiningRun that gives its slots back
  std::string to_job;  // the job it gives them to
};
// Which waiting runs give their slots back, so that two jobs cannot hold
// one slot each of the other's nodes and wait for each other until both
// fail: wound-wait over the order every node agrees on. The queue's head
// of line (Schedule's first eligible run that does not fit), when it is a
// multi-node run, takes the slots of waiting runs of jobs that order after
// it (lower priority, or equal priority and a later job name) and have
// waited at least `after_s`, the latest-ordered first, as many as it needs;
// none when even all of them would not make it fit. A run that orders
// first never yields to one that orders later, so the first job in the
// order gets every node it needs.
std::vector<Yield> YieldsFor(std::vector<QueuedRun> queue, const std::vector<JoiningRun>& joining,
                             const std::vector<SlotView>& slots, double now_s, double after_s);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_SCHEDULER_H_
