// When a slot whose worker ended may be used again (DESIGN.md, Slots and
// GPUs), as a pure function: the caller gathers the facts (the worker's
// process group, the GPU query) and applies the decision (kill what it
// names, free or strand the slot).
#ifndef TRAINSUP_SUPERVISOR_POLICY_SLOT_RELEASE_H_
#define TRAINSUP_SUPERVISOR_POLICY_SLOT_RELEASE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/sys/gpu_monitor.h"

namespace trainsup::supervisor {

struct ReleaseFacts {
  // Live members of the worker's own group (GroupOwnership::kOurs); empty
  // when the group is gone or its id now belongs to a stranger.
  std::vector<int> our_group;
  int pgid = 0;
  // A GPU slot whose GPU is queried: then `gpu` is the query's entry for it
  // (nullopt when the query failed, with query_error, or lacked it).
  bool gpu_checked = false;
  int gpu_index = -1;
  std::optional<GpuInfo> gpu;
  std::string query_error;
  int64_t idle_bytes = 0;
  bool stranded = false;       // already STRANDED
  bool past_deadline = false;  // the release timeout has passed
};

struct ReleaseDecision {
  enum Verdict { kFree, kWait, kStrand };
  Verdict verdict = kWait;
  std::string reason;             // why it is (being) stranded
  bool kill_group = false;        // SIGKILL the worker's group (leftovers)
  std::vector<int> kill_holders;  // GPU holders of the worker's group to SIGKILL
};

// Free once the group is empty and the GPU (if checked) released: no
// compute process and memory at the idle level. A GPU the query cannot see
// is not released. Holders in the worker's group are killed, others never.
// Not free by the deadline: kStrand, "GPU memory not released: <why>" or
// "process group G survives SIGKILL". A stranded slot stays so until free.
ReleaseDecision DecideRelease(const ReleaseFacts& facts);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_SLOT_RELEASE_H_
