#include "supervisor/policy/slot_release.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace trainsup::supervisor {

ReleaseDecision DecideRelease(const ReleaseFacts& facts) {
  ReleaseDecision d;
  const bool group_empty = facts.our_group.empty();
  d.kill_group = !group_empty;
  bool gpu_released = true;
  std::string why;
  if (facts.gpu_checked) {
    if (!facts.gpu) {
      gpu_released = false;
      why = facts.query_error.empty()
                ? absl::StrCat("GPU ", facts.gpu_index, " missing from the GPU query")
                : absl::StrCat("GPU query failed: ", facts.query_error);
    } else {
      ReleaseCheck c = CheckReleased(*facts.gpu, facts.idle_bytes);
      gpu_released = c.released;
      why = c.reason;
      for (int pid : c.holders) {
        if (std::find(facts.our_group.begin(), facts.our_group.end(), pid) !=
            facts.our_group.end()) {
          d.kill_holders.push_back(pid);
        }
      }
    }
  }
  if (group_empty && gpu_released) {
    d.verdict = ReleaseDecision::kFree;
    return d;
  }
  if (facts.stranded || facts.past_deadline) {
    d.verdict = ReleaseDecision::kStrand;
    d.reason = group_empty ? absl::StrCat("GPU memory not released: ", why)
                           : absl::StrCat("process group ", facts.pgid, " survives SIGKILL");
    return d;
  }
  d.verdict = ReleaseDecision::kWait;
  return d;
}

}  // namespace trainsup::supervisor
