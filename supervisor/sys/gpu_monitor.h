// The GPUs of this node, behind an interface: NVML loaded at run time
// (dlopen of libnvidia-ml.so.1, never linked, so the daemon starts on
// machines without a driver), or a JSON file for tests and demos on
// machines without a GPU. Plus the pure check the daemon runs before it
// reuses a GPU after a worker died.
#ifndef TRAINSUP_SUPERVISOR_SYS_GPU_MONITOR_H_
#define TRAINSUP_SUPERVISOR_SYS_GPU_MONITOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainsup::supervisor {

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
};

// Thread-compatible: callers serialize Query().
class GpuMonitor {
 public:
  virtual ~GpuMonitor();
  // Whether Query() can work: false when NVML is absent or did not
  // initialize (the node then offers CPU slots only).
  virtual bool available() const = 0;
  // Every GPU, by index. FailedPrecondition when !available(); other errors
  // carry NVML's (or the file's) message.
  virtual absl::StatusOr<std::vector<GpuInfo>> Query() = 0;
};

// NVML from `library` (default libnvidia-ml.so.1). Never null: when the
// library is missing, lacks a required symbol or nvmlInit fails, the
// monitor is not available(). nvmlShutdown and dlclose on destruction.
std::unique_ptr<GpuMonitor> OpenNvmlMonitor(const std::string& library = "libnvidia-ml.so.1");

// GPUs described by the JSON file at `json_path`, read again on every
// Query so a test can change them between calls:
//   {"gpus": [{"uuid": "GPU-0", "name": "Fake", "memory_total": 8589934592,
//              "memory_used": 0, "compute_pids": [123]}]}
// index is the position in the array; every key but uuid is optional.
// Always available(); Query is NotFound for a missing file and
// InvalidArgument for malformed content.
std::unique_ptr<GpuMonitor> OpenFakeMonitor(const std::string& json_path);

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

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_SYS_GPU_MONITOR_H_
