#include "supervisor/policy/elastic_growth.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainsup::supervisor {

bool RunsShort(const GangView& g) { return g.running_ranks > 0 && g.running_ranks < g.world_size; }

std::vector<std::string> RunsThatMayTakeASlot(const std::vector<GangView>& gangs) {
  std::vector<std::string> out;
  for (const GangView& g : gangs) {
    if (g.phase == GangPhase::kWaiting || RunsShort(g)) out.push_back(g.run_id);
  }
  return out;
}

bool GrowthHeldBack(const GangView& gang, const std::vector<GangView>& gangs, int usable_slots) {
  for (const GangView& w : gangs) {
    if (w.phase == GangPhase::kWaiting && w.run_id != gang.run_id && w.priority >= gang.priority &&
        w.smallest_gang <= usable_slots) {
      return true;
    }
  }
  return false;
}

std::optional<Growth> DecideGrowth(const std::vector<GangView>& gangs,
                                   const std::vector<std::string>& free_slots, int usable_slots,
                                   double now_s, std::map<std::string, double>& growable_since_s) {
  for (const GangView& g : gangs) {
    const bool can_grow = !free_slots.empty() && !g.multi_node && g.phase == GangPhase::kRunning &&
                          RunsShort(g) && !GrowthHeldBack(g, gangs, usable_slots);
    if (!can_grow) {
      growable_since_s.erase(g.run_id);
      continue;
    }
    auto it = growable_since_s.emplace(g.run_id, now_s).first;
    if (now_s - it->second < g.grow_after_s) continue;
    growable_since_s.erase(it);
    const bool one = free_slots.size() == 1;
    return Growth{g.run_id, absl::StrCat(one ? "slot " : "slots ", absl::StrJoin(free_slots, ", "),
                                         one ? " is" : " are", " free again")};
  }
  return std::nullopt;
}

}  // namespace trainsup::supervisor
