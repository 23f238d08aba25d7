#include "supervisor/policy/scheduler.h"

#include <algorithm>

namespace trainsup::supervisor {

namespace {

// a before b in the order of multi-node jobs (OrderQueue, YieldsFor).
bool JobBefore(int a_priority, const std::string& a_job, int b_priority, const std::string& b_job) {
  if (a_priority != b_priority) return a_priority > b_priority;
  return a_job < b_job;
}

bool Eligible(const QueuedRun& run, size_t slots, double now_s) {
  return run.not_before_s <= now_s && run.world_size >= 1 &&
         static_cast<size_t>(run.world_size) <= slots;
}

size_t FreeCount(const std::vector<SlotView>& slots) {
  std::vector<int> free;
  for (const SlotView& s : slots) {
    if (s.free) free.push_back(s.index);
  }
  std::sort(free.begin(), free.end());
  return static_cast<size_t>(std::unique(free.begin(), free.end()) - free.begin());
}

}  // namespace

void OrderQueue(std::vector<QueuedRun>& queue) {
  std::stable_sort(queue.begin(), queue.end(), [](const QueuedRun& a, const QueuedRun& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  // Within each priority, the multi-node runs' places, refilled in job order.
  for (size_t begin = 0; begin < queue.size();) {
    size_t end = begin;
    std::vector<size_t> places;
    while (end < queue.size() && queue[end].priority == queue[begin].priority) {
      if (!queue[end].job.empty()) places.push_back(end);
      ++end;
    }
    std::vector<QueuedRun> jobs;
    for (size_t i : places) jobs.push_back(std::move(queue[i]));
    std::stable_sort(jobs.begin(), jobs.end(),
                     [](const QueuedRun& a, const QueuedRun& b) { return a.job < b.job; });
    for (size_t k = 0; k < places.size(); ++k) queue[places[k]] = std::move(jobs[k]);
    begin = end;
  }
}

int SmallestGang(const QueuedRun& run) {
  return run.min_world_size >= 1 ? std::min(run.world_size, run.min_world_size) : run.world_size;
}

std::vector<Placement> Schedule(std::vector<QueuedRun> queue, const std::vector<SlotView>& slots,
                                double now_s) {
  OrderQueue(queue);
  // Free slot indices, ascending; placed ones are erased from the front, so
  // each index is handed out at most once.
  std::vector<int> free;
  for (const SlotView& s : slots) {
    if (s.free) free.push_back(s.index);
  }
  std::sort(free.begin(), free.end());
  free.erase(std::unique(free.begin(), free.end()), free.end());

  size_t usable = 0;
  for (const SlotView& s : slots) usable += s.usable ? 1 : 0;

  std::vector<Placement> placements;
  for (QueuedRun& run : queue) {
    if (!Eligible(run, slots.size(), now_s)) continue;
    const size_t want = static_cast<size_t>(run.world_size);
    const size_t least = static_cast<size_t>(SmallestGang(run));
    if (least > usable) continue;  // waits for drained slots, blocking no one
    const size_t target = std::min(want, usable);
    size_t n = 0;
    if (free.size() >= target) {
      n = target;
    } else if (free.size() >= least && now_s >= run.shrink_at_s) {
      n = free.size();
    } else {
      break;
    }
    Placement p{std::move(run.run_id), std::vector<int>(free.begin(), free.begin() + n)};
    free.erase(free.begin(), free.begin() + n);
    placements.push_back(std::move(p));
  }
  return placements;
}

std::vector<Yield> YieldsFor(std::vector<QueuedRun> queue, const std::vector<JoiningRun>& joining,
                             const std::vector<SlotView>& slots, double now_s, double after_s) {
  OrderQueue(queue);
  size_t free = FreeCount(slots);
  for (const JoiningRun& j : joining) {
    if (j.yielding) free += static_cast<size_t>(std::max(0, j.slots));
  }
  for (const QueuedRun& run : queue) {
    if (!Eligible(run, slots.size(), now_s)) continue;
    const size_t need = static_cast<size_t>(run.world_size);
    if (need <= free) {
      free -= need;  // Schedule places it
      continue;
    }
    // The head of the line.
    if (run.job.empty()) return {};
    std::vector<const JoiningRun*> after;
    for (const JoiningRun& j : joining) {
      if (!j.yielding && now_s - j.joined_s >= after_s &&
          JobBefore(run.priority, run.job, j.priority, j.job)) {
        after.push_back(&j);
      }
    }
    // The latest-ordered first.
    std::sort(after.begin(), after.end(), [](const JoiningRun* a, const JoiningRun* b) {
      if (a->priority != b->priority || a->job != b->job) {
        return JobBefore(b->priority, b->job, a->priority, a->job);
      }
      return a->run_id < b->run_id;
    });
    std::vector<Yield> yields;
    for (const JoiningRun* j : after) {
      if (free >= need) break;
      yields.push_back(Yield{j->run_id, run.job});
      free += static_cast<size_t>(std::max(0, j->slots));
    }
    return free >= need ? yields : std::vector<Yield>{};
  }
  return {};
}

}  // namespace trainsup::supervisor
