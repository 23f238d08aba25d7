#include "supervisor/policy/slot_release.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainsup::supervisor {

std::string GpuHealthProblem(const GpuInfo& gpu) {
  if (gpu.lost) return "lost (fell off the bus)";
  if (gpu.ecc_uncorrected > 0) {
    return absl::StrCat("uncorrectable ECC errors (", gpu.ecc_uncorrected, ")");
  }
  if (gpu.retired_pages_pending) return "page retirement pending";
  // The Xids after which NVIDIA's Xid catalog says to reset the GPU (or
  // to drain it until one); the others (13 graphics engine exception, 31
  // memory page fault, 43 stopped channel, ...) are the application's.
  static constexpr int kResetXids[] = {
      48,   // double-bit ECC error
      63,   // page retirement or row remapping recorded: takes effect at a reset
      64,   // page retirement or row remapping failed
      74,   // NVLink error
      79,   // fallen off the bus
      92,   // high single-bit ECC error rate
      94,   // contained ECC error: reset when convenient
      95,   // uncontained ECC error: every context on the GPU is lost
      119,  // GSP RPC timeout
      120,  // GSP error
  };
  for (int xid : gpu.xids) {
    for (int reset : kResetXids) {
      if (xid == reset) return absl::StrCat("Xid ", xid, " (needs a GPU reset)");
    }
  }
  return "";
}

ReleaseCheck CheckReleased(const GpuInfo& gpu, int64_t idle_bytes) {
  ReleaseCheck check;
  constexpr int64_t kMiB = 1 << 20;
  if (!gpu.compute_pids.empty()) {
    check.holders = gpu.compute_pids;
    check.reason =
        absl::StrCat("GPU ", gpu.index, " (", gpu.uuid, ") still has ", gpu.compute_pids.size(),
                     " compute process(es): ", absl::StrJoin(gpu.compute_pids, ", "));
  } else if (gpu.memory_used > idle_bytes) {
    check.reason = absl::StrCat("GPU ", gpu.index, " (", gpu.uuid, ") has no compute process but ",
                                gpu.memory_used / kMiB, " MiB used, above the idle level of ",
                                idle_bytes / kMiB, " MiB");
  } else {
    check.released = true;
    check.reason = absl::StrCat("GPU ", gpu.index, " (", gpu.uuid,
                                ") released: ", gpu.memory_used / kMiB, " MiB used");
  }
  return check;
}

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
    d.reason = why;
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
