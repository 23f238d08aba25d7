#include "supervisor/policy/run_history.h"

#include <algorithm>

namespace trainsup::supervisor {

RunHistory RebuildHistory(const v1::Run& stored) {
  RunHistory h;
  for (const v1::Attempt& a : stored.attempts()) {
    if (a.ended_ms() == 0) continue;
    AttemptEnd end;
    end.end_s = static_cast<double>(a.ended_ms()) / 1000.0;
    end.cls = ExitClassFromProto(a.exit_class()).value_or(ExitClass::kCrash);
    const int64_t from = std::max<int64_t>(a.resumed_from_step(), 0);
    for (const v1::RankStatus& rs : a.ranks()) {
      if (rs.progress().step() > from) end.made_progress = true;
    }
    end.stop_requested = a.stop_requested() || end.cls == ExitClass::kCancelled;
    end.detail = a.exit_reason();
    if (end.cls == ExitClass::kOom) h.oom_exits++;
    h.ends.push_back(std::move(end));
  }
  return h;
}

}  // namespace trainsup::supervisor
