// When an elastic gang that runs with fewer ranks than its world size grows
// back (docs/distributed.md, "Elastic gangs"), and which runs hear of a slot
// offered again, as pure functions of the runs, the free slots and the time.
// The daemon gathers the views and applies the verdict (RunUnit::Resize).
#ifndef TRAINSUP_SUPERVISOR_POLICY_ELASTIC_GROWTH_H_
#define TRAINSUP_SUPERVISOR_POLICY_ELASTIC_GROWTH_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trainsup::supervisor {

// Where a run is, as growth sees it.
enum class GangPhase {
  kWaiting,  // PENDING or RESTARTING: wants slots (queued, in backoff, waiting
             // for disk space, or preparing its start)
  kRunning,  // RUNNING
  kOther,    // starting, or ending
};

struct GangView {
  std::string run_id;
  GangPhase phase = GangPhase::kOther;
  bool multi_node = false;  // a multi-node job grows through its cluster member
  int running_ranks = 0;    // ranks of the current attempt alive now
  int world_size = 1;       // the spec's world size
  double grow_after_s = 0;  // the spec's elastic.grow_after_s
  int priority = 0;         // the run's priority (higher goes first)
  int smallest_gang = 1;    // the fewest slots it starts with (SmallestGang)
};

// Some ranks run, fewer than the world size: the gang could take more slots.
bool RunsShort(const GangView& gang);

// The runs a slot offered again may serve, in the order given: those waiting
// for slots, and the gangs that run short.
std::vector<std::string> RunsThatMayTakeASlot(const std::vector<GangView>& gangs);

struct Growth {
  std::string run_id;
  std::string reason;  // "slot cpu:2 is free again", "slots gpu:1, gpu:3 are free again"
};

// Whether a run in `gangs` that waits for slots holds back the growth of
// `gang`: it waits (in the queue, in a restart's backoff, for disk space,
// or preparing its start), its priority is at least the gang's, and its
// smallest gang fits the `usable_slots` (one that cannot start until
// drained slots come back holds nothing back).
bool GrowthHeldBack(const GangView& gang, const std::vector<GangView>& gangs, int usable_slots);

// Whether a gang grows now. `growable_since_s` holds, per run, since when it
// could grow; the call updates it. Rules:
//  1. A gang can grow when it is local (not multi_node), RUNNING, runs
//     short, some slot is free, and no waiting run holds its growth back
//     (GrowthHeldBack: such a run has the free slots first, whatever their
//     number). A gang that cannot grow loses its entry.
//  2. The first gang (in the order given) that could grow for at least
//     grow_after_s grows: its entry goes, and the reason names the free
//     slots. One at a time: the gangs after it are not looked at, and the
//     daemon asks again once that one has restarted.
//  3. A gang that can grow but not yet keeps (or starts) its entry.
std::optional<Growth> DecideGrowth(const std::vector<GangView>& gangs,
                                   const std::vector<std::string>& free_slots, int usable_slots,
                                   double now_s, std::map<std::string, double>& growable_since_s);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_ELASTIC_GROWTH_H_
