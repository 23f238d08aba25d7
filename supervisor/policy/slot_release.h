// When a slot whose worker ended may be used again (docs/design.md, Slots and
// GPUs), as a pure function: the caller gathers the facts (the worker's
// process group, the GPU query) and applies the decision (kill what it
// names, free or strand the slot).
#ifndef TRAINSUP_SUPERVISOR_POLICY_SLOT_RELEASE_H_
#define TRAINSUP_SUPERVISOR_POLICY_SLOT_RELEASE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainsup::supervisor {

// One GPU as the GPU monitor (supervisor/sys/gpu_monitor.h) reports it.
struct GpuInfo {
  int index = 0;             // NVML index: PCI bus order (CUDA's only with
                             // CUDA_DEVICE_ORDER=PCI_BUS_ID; the uuid is safer)
  std::string uuid;          // "GPU-…": stable across reboots, unlike the index
  std::string name;          // "NVIDIA H100 80GB HBM3"
  int64_t memory_total = 0;  // bytes
  int64_t memory_used = 0;   // bytes
  // Pids of processes with a compute context on this GPU, ascending. Pids
  // are as NVML sees them: in a container they may be the host's.
  std::vector<int> compute_pids;
  // Health (GpuHealthProblem), each read only where the driver offers it:
  // the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST); uncorrectable ECC
  // errors since the driver loaded (volatile count); pages waiting to be
  // retired, or rows to be remapped, at the next reset; the Xid events
  // seen since the previous query (the fake GPU file: those it lists).
  bool lost = false;
  int64_t ecc_uncorrected = 0;
  bool retired_pages_pending = false;
  std::vector<int> xids;
  // A health query that failed for this GPU (the others are still read).
  std::string health_error;
};

// "" for a healthy GPU, else why its slot is drained (docs/distributed.md,
// "Elastic"), naming the first problem in this order: "lost (fell off the
// bus)", "uncorrectable ECC errors (N)", "page retirement pending", "Xid N
// (needs a GPU reset)". Only the Xids that NVIDIA's Xid catalog says need
// a GPU reset count (48 double-bit ECC, 63/64 page retirement or row
// remapping, 74 NVLink, 79 fallen off the bus, 92/94/95 ECC, 119/120 GSP);
// an application's fault (13, 31, 43, ...) does not.
std::string GpuHealthProblem(const GpuInfo& gpu);

struct ReleaseCheck {
  bool released = false;
  std::vector<int> holders;  // compute pids still on the GPU
  std::string reason;        // for events and logs
};

// Whether a GPU is free again after its worker died: no compute process
// left and memory_used <= idle_bytes. Otherwise `holders` lists the pids
// still holding it, so the daemon can kill those of the worker's process
// group and declare the GPU stranded if others remain or memory stays up.
ReleaseCheck CheckReleased(const GpuInfo& gpu, int64_t idle_bytes);

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
  std::string reason;             // why it is (being) stranded; kFree: the GPU's reading
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
