// The GPUs of this node, behind an interface: NVML loaded at run time
// (dlopen of libnvidia-ml.so.1, never linked, so the daemon starts on
// machines without a driver), or a JSON file for tests and demos on
// machines without a GPU. What it reports (GpuInfo) and the pure check
// of a GPU's release are in supervisor/policy/slot_release.h.
#ifndef TRAINSUP_SUPERVISOR_SYS_GPU_MONITOR_H_
#define TRAINSUP_SUPERVISOR_SYS_GPU_MONITOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "supervisor/policy/slot_release.h"

namespace trainsup::supervisor {

// Thread-compatible: callers serialize Query().
class GpuMonitor {
 public:
  virtual ~GpuMonitor();
  // Whether Query() can work: false when NVML is absent or did not
  // initialize (the node then offers CPU slots only).
  virtual bool available() const = 0;
  // Every GPU, by index, a lost one too (GpuInfo::lost), so that a slot
  // keeps its GPU's index. FailedPrecondition when !available(); other
  // errors carry NVML's (or the file's) message. A failing health query
  // never fails Query: it is noted in that GPU's health_error.
  virtual absl::StatusOr<std::vector<GpuInfo>> Query() = 0;
  // Where the readings come from, for the daemon's start-up log: NVML's
  // loaded file and the driver's version, or the fake GPU file; when not
  // available(), why.
  virtual std::string Describe() const = 0;
};

// NVML from `library` (default libnvidia-ml.so.1). Never null: when the
// library is missing, lacks a required symbol or nvmlInit fails, the
// monitor is not available(). nvmlShutdown and dlclose on destruction.
// The health calls are optional: a driver without one reports the other
// facts. NVML_ERROR_GPU_IS_LOST from any call marks the GPU lost. Xids are
// the events since the previous Query (each GPU is registered for Xid
// events the first time a Query sees it), so each is reported once.
std::unique_ptr<GpuMonitor> OpenNvmlMonitor(const std::string& library = "libnvidia-ml.so.1");

// GPUs described by the JSON file at `json_path`, read again on every
// Query so a test can change them between calls:
//   {"gpus": [{"uuid": "GPU-0", "name": "Fake", "memory_total": 8589934592,
//              "memory_used": 0, "compute_pids": [123]}]}
// index is the position in the array; every key but uuid is optional.
// Health keys (GpuInfo; docs/distributed.md, "Elastic"): "lost": bool,
// "ecc_uncorrected": int >= 0, "retired_pages_pending": bool, "xids":
// [int, ...]. The file is the GPU's state now: an Xid listed is reported
// at every query while it stays listed.
// Always available(); Query is NotFound for a missing file and
// InvalidArgument for malformed content, naming the GPU and the key
// ("gpus[1].lost: expected a boolean").
std::unique_ptr<GpuMonitor> OpenFakeMonitor(const std::string& json_path);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_SYS_GPU_MONITOR_H_
