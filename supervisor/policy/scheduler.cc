#include "supervisor/policy/scheduler.h"

#include <algorithm>

namespace trainsup::supervisor {

std::vector<Placement> Schedule(std::vector<QueuedRun> queue, const std::vector<SlotView>& slots,
                                double now_s) {
  std::stable_sort(queue.begin(), queue.end(), [](const QueuedRun& a, const QueuedRun& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  // Free slot indices, ascending; placed ones are erased from the front, so
  // each index is handed out at most once.
  std::vector<int> free;
  for (const SlotView& s : slots) {
    if (s.free) free.push_back(s.index);
  }
  std::sort(free.begin(), free.end());
  free.erase(std::unique(free.begin(), free.end()), free.end());

  std::vector<Placement> placements;
  for (QueuedRun& run : queue) {
    if (run.not_before_s > now_s) continue;
    if (run.world_size < 1 || static_cast<size_t>(run.world_size) > slots.size()) continue;
    if (static_cast<size_t>(run.world_size) > free.size()) break;
    Placement p{std::move(run.run_id),
                std::vector<int>(free.begin(), free.begin() + run.world_size)};
    free.erase(free.begin(), free.begin() + run.world_size);
    placements.push_back(std::move(p));
  }
  return placements;
}

}  // namespace trainsup::supervisor
