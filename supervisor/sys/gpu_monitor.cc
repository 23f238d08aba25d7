#include "supervisor/sys/gpu_monitor.h"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainsup::supervisor {
namespace {

// The few NVML declarations used, as in nvml.h (ABI-stable across driver
// releases), so that no CUDA headers are needed to build.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr unsigned kNvmlNameBufferSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kNvmlUuidBufferSize = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
// For nvmlDeviceGetComputeRunningProcesses_v3 (and _v2).
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
// Health (nvml.h): nvmlDeviceGetTotalEccErrors(device, errorType,
// counterType, &count), NVML_MEMORY_ERROR_TYPE_UNCORRECTED and
// NVML_VOLATILE_ECC; NVML_ERROR_NOT_SUPPORTED where a GPU has no ECC;
// NVML_ERROR_GPU_IS_LOST once it fell off the bus;
// nvmlDeviceGetRetiredPagesPendingStatus gives an nvmlEnableState_t. Xid
// events through an event set (nvmlEventTypeXidCriticalError; eventData is
// the Xid), read with nvmlEventSetWait_v2, whose nvmlEventData_t has the
// MIG instance ids (the unversioned wait has a shorter struct).
constexpr nvmlReturn_t kNvmlNotSupported = 3;
constexpr nvmlReturn_t kNvmlGpuIsLost = 15;
constexpr int kNvmlMemoryErrorUncorrected = 1;
constexpr int kNvmlVolatileEcc = 0;
constexpr int kNvmlFeatureEnabled = 1;
constexpr unsigned long long kNvmlEventTypeXidCriticalError = 0x8ULL;
using nvmlEventSet_t = struct nvmlEventSet_st*;
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
// For the unversioned nvmlDeviceGetComputeRunningProcesses of old drivers.
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};

class NvmlMonitor final : public GpuMonitor {
 public:
  explicit NvmlMonitor(const std::string& library) : library_(library) {
    handle_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* error = dlerror();
      load_error_ = error != nullptr ? error : "dlopen failed";
      return;
    }
    const bool resolved = Resolve("nvmlInit_v2", &init_) && Resolve("nvmlShutdown", &shutdown_) &&
                          Resolve("nvmlDeviceGetCount_v2", &get_count_) &&
                          Resolve("nvmlDeviceGetHandleByIndex_v2", &get_handle_) &&
                          Resolve("nvmlDeviceGetName", &get_name_) &&
                          Resolve("nvmlDeviceGetUUID", &get_uuid_) &&
                          Resolve("nvmlDeviceGetMemoryInfo", &get_memory_);
    Resolve("nvmlErrorString", &error_string_);
    // Health (optional: a driver without one of these reports the rest).
    Resolve("nvmlDeviceGetTotalEccErrors", &get_ecc_);
    Resolve("nvmlDeviceGetRetiredPagesPendingStatus", &get_pages_pending_);
    Resolve("nvmlDeviceGetRemappedRows", &get_remapped_rows_);
    Resolve("nvmlEventSetCreate", &event_set_create_);
    Resolve("nvmlDeviceRegisterEvents", &register_events_);
    Resolve("nvmlEventSetWait_v2", &event_set_wait_);
    Resolve("nvmlEventSetFree", &event_set_free_);
    if (!Resolve("nvmlDeviceGetComputeRunningProcesses_v3", &get_processes_v3_)) {
      Resolve("nvmlDeviceGetComputeRunningProcesses", &get_processes_v1_);
    }
    initialized_ = resolved && (get_processes_v3_ != nullptr || get_processes_v1_ != nullptr) &&
                   init_() == kNvmlSuccess;
  }

  ~NvmlMonitor() override {
    if (events_ != nullptr && event_set_free_ != nullptr) event_set_free_(events_);
    if (initialized_) shutdown_();
    if (handle_ != nullptr) dlclose(handle_);
  }

  bool available() const override { return initialized_; }

  std::string Describe() const override {
    if (handle_ == nullptr) return absl::StrCat("NVML: cannot load ", library_, ": ", load_error_);
    // The file the dynamic linker chose for the name asked for.
    std::string file = library_;
    Dl_info info;
    if (init_ != nullptr && dladdr(reinterpret_cast<void*>(init_), &info) != 0 &&
        info.dli_fname != nullptr) {
      file = info.dli_fname;
    }
    if (!initialized_) return absl::StrCat("NVML from ", file, ": not initialized");
    std::string driver = "unknown";
    using VersionFn = nvmlReturn_t (*)(char*, unsigned);
    if (auto get = reinterpret_cast<VersionFn>(dlsym(handle_, "nvmlSystemGetDriverVersion"))) {
      char text[96] = {};
      if (get(text, sizeof(text)) == kNvmlSuccess) driver = text;
    }
    return absl::StrCat("NVML from ", file, ", driver ", driver);
  }

  absl::StatusOr<std::vector<GpuInfo>> Query() override {
    if (!initialized_) return absl::FailedPreconditionError("NVML is not available");
    unsigned count = 0;
    if (nvmlReturn_t r = get_count_(&count); r != kNvmlSuccess)
      return Error("nvmlDeviceGetCount", r);
    std::vector<GpuInfo> gpus(count);
    // The GPUs NVML gave a handle for, with their index (= place in `gpus`).
    std::vector<std::pair<nvmlDevice_t, size_t>> devices;
    for (unsigned i = 0; i < count; ++i) {
      GpuInfo& gpu = gpus[i];
      gpu.index = static_cast<int>(i);
      nvmlDevice_t device = nullptr;
      if (nvmlReturn_t r = get_handle_(i, &device); r != kNvmlSuccess) {
        if (r != kNvmlGpuIsLost) {
          return Error(absl::StrCat("nvmlDeviceGetHandleByIndex(", i, ")"), r);
        }
        MarkLost(&gpu);
        continue;
      }
      if (absl::Status s = ReadGpu(device, &gpu); !s.ok()) return s;
      if (!gpu.lost) ReadHealth(device, &gpu);
      devices.emplace_back(device, i);
    }
    ReadXids(devices, &gpus);
    return gpus;
  }

 private:
  // A GPU that fell off the bus is still listed, so that its slot keeps
  // its index and is drained.
  static void MarkLost(GpuInfo* gpu) {
    gpu->lost = true;
    if (gpu->name.empty()) gpu->name = "lost";
  }

  static void AddHealthError(GpuInfo* gpu, const std::string& error) {
    gpu->health_error = gpu->health_error.empty() ? error : gpu->health_error + "; " + error;
  }

  // Name, uuid, memory and compute pids. A GPU lost meanwhile
  // (NVML_ERROR_GPU_IS_LOST) is marked lost and keeps what was read; any
  // other error fails the query.
  absl::Status ReadGpu(nvmlDevice_t device, GpuInfo* gpu) const {
    char text[std::max(kNvmlNameBufferSize, kNvmlUuidBufferSize)] = {};
    const char* call = "nvmlDeviceGetName";
    nvmlReturn_t r = get_name_(device, text, kNvmlNameBufferSize);
    if (r == kNvmlSuccess) {
      gpu->name = text;
      call = "nvmlDeviceGetUUID";
      r = get_uuid_(device, text, kNvmlUuidBufferSize);
    }
    nvmlMemory_t memory{};
    if (r == kNvmlSuccess) {
      gpu->uuid = text;
      call = "nvmlDeviceGetMemoryInfo";
      r = get_memory_(device, &memory);
    }
    if (r == kNvmlSuccess) {
      gpu->memory_total = static_cast<int64_t>(memory.total);
      gpu->memory_used = static_cast<int64_t>(memory.used);
      call = "nvmlDeviceGetComputeRunningProcesses";
      r = get_processes_v3_ != nullptr
              ? ComputePids<nvmlProcessInfo_t>(get_processes_v3_, device, &gpu->compute_pids)
              : ComputePids<nvmlProcessInfo_v1_t>(get_processes_v1_, device, &gpu->compute_pids);
    }
    if (r == kNvmlSuccess) return absl::OkStatus();
    if (r == kNvmlGpuIsLost) {
      MarkLost(gpu);
      return absl::OkStatus();
    }
    return Error(call, r);
  }

  // The GPU's health facts, each where the driver has the call. A failure
  // is noted in the GPU (health_error) and never fails the query; an
  // unsupported fact (no ECC, no row remapping) is simply not there.
  void ReadHealth(nvmlDevice_t device, GpuInfo* gpu) const {
    const auto note = [&](const char* call, nvmlReturn_t r) {
      if (r == kNvmlGpuIsLost) {
        MarkLost(gpu);
      } else if (r != kNvmlSuccess && r != kNvmlNotSupported) {
        AddHealthError(gpu, std::string(Error(call, r).message()));
      }
    };
    if (get_ecc_ != nullptr) {
      unsigned long long count = 0;
      const nvmlReturn_t r =
          get_ecc_(device, kNvmlMemoryErrorUncorrected, kNvmlVolatileEcc, &count);
      note("nvmlDeviceGetTotalEccErrors", r);
      if (r == kNvmlSuccess) gpu->ecc_uncorrected = static_cast<int64_t>(count);
    }
    if (get_pages_pending_ != nullptr) {
      int state = 0;  // nvmlEnableState_t
      const nvmlReturn_t r = get_pages_pending_(device, &state);
      note("nvmlDeviceGetRetiredPagesPendingStatus", r);
      if (r == kNvmlSuccess && state == kNvmlFeatureEnabled) gpu->retired_pages_pending = true;
    }
    if (get_remapped_rows_ != nullptr) {
      unsigned corrected = 0, uncorrected = 0, pending = 0, failure = 0;
      const nvmlReturn_t r =
          get_remapped_rows_(device, &corrected, &uncorrected, &pending, &failure);
      note("nvmlDeviceGetRemappedRows", r);
      if (r == kNvmlSuccess && (pending != 0 || failure != 0)) gpu->retired_pages_pending = true;
    }
  }

  // The Xid events since the last query, into the GPUs they happened on.
  // The event set is made on the first query, and each GPU registered the
  // first time it is seen (a registration that fails is not retried).
  void ReadXids(const std::vector<std::pair<nvmlDevice_t, size_t>>& devices,
                std::vector<GpuInfo>* gpus) {
    if (event_set_create_ == nullptr || register_events_ == nullptr || event_set_wait_ == nullptr) {
      return;
    }
    if (events_ == nullptr && event_set_create_(&events_) != kNvmlSuccess) {
      events_ = nullptr;
      return;
    }
    for (const auto& [device, place] : devices) {
      if (std::find(registered_.begin(), registered_.end(), device) != registered_.end()) continue;
      registered_.push_back(device);
      const nvmlReturn_t r = register_events_(device, kNvmlEventTypeXidCriticalError, events_);
      if (r != kNvmlSuccess && r != kNvmlNotSupported && r != kNvmlGpuIsLost) {
        AddHealthError(&(*gpus)[place],
                       std::string(Error("nvmlDeviceRegisterEvents", r).message()));
      }
    }
    // Bounded: a storm of events waits for the next query. Any return but
    // success (NVML_ERROR_TIMEOUT: none left) ends the drain.
    for (int i = 0; i < 256; ++i) {
      nvmlEventData_t data{};
      if (event_set_wait_(events_, &data, 0) != kNvmlSuccess) break;
      if ((data.eventType & kNvmlEventTypeXidCriticalError) == 0) continue;
      for (const auto& [device, place] : devices) {
        if (device == data.device) (*gpus)[place].xids.push_back(static_cast<int>(data.eventData));
      }
    }
  }

  template <typename Fn>
  bool Resolve(const char* name, Fn** fn) {
    *fn = reinterpret_cast<Fn*>(dlsym(handle_, name));
    return *fn != nullptr;
  }

  absl::Status Error(const std::string& call, nvmlReturn_t r) const {
    const char* text = error_string_ != nullptr ? error_string_(r) : nullptr;
    return absl::UnavailableError(
        absl::StrCat(call, " failed: ", text != nullptr ? text : "NVML error ", r));
  }

  // The list grows between the sizing call and the real one when processes
  // start, so retry while NVML says the buffer is too small (and give up
  // with NVML_ERROR_INSUFFICIENT_SIZE if it keeps growing).
  template <typename Info>
  nvmlReturn_t ComputePids(nvmlReturn_t (*fn)(nvmlDevice_t, unsigned*, Info*), nvmlDevice_t device,
                           std::vector<int>* pids) const {
    std::vector<Info> infos(16);
    for (int attempt = 0; attempt < 8; ++attempt) {
      unsigned count = static_cast<unsigned>(infos.size());
      const nvmlReturn_t r = fn(device, &count, infos.data());
      if (r == kNvmlInsufficientSize) {
        infos.resize(std::max<size_t>(count, infos.size()) * 2);
        continue;
      }
      if (r != kNvmlSuccess) return r;
      count = std::min(count, static_cast<unsigned>(infos.size()));
      pids->clear();
      for (unsigned k = 0; k < count; ++k) pids->push_back(static_cast<int>(infos[k].pid));
      std::sort(pids->begin(), pids->end());
      pids->erase(std::unique(pids->begin(), pids->end()), pids->end());
      return kNvmlSuccess;
    }
    return kNvmlInsufficientSize;
  }

  std::string library_;
  std::string load_error_;
  void* handle_ = nullptr;
  bool initialized_ = false;
  nvmlReturn_t (*init_)() = nullptr;
  nvmlReturn_t (*shutdown_)() = nullptr;
  nvmlReturn_t (*get_count_)(unsigned*) = nullptr;
  nvmlReturn_t (*get_handle_)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*get_name_)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*get_uuid_)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*get_memory_)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*get_processes_v3_)(nvmlDevice_t, unsigned*, nvmlProcessInfo_t*) = nullptr;
  nvmlReturn_t (*get_processes_v1_)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v1_t*) = nullptr;
  const char* (*error_string_)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*get_ecc_)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*get_pages_pending_)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*get_remapped_rows_)(nvmlDevice_t, unsigned*, unsigned*, unsigned*,
                                     unsigned*) = nullptr;
  nvmlReturn_t (*event_set_create_)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*register_events_)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*event_set_wait_)(nvmlEventSet_t, nvmlEventData_t*, unsigned) = nullptr;
  nvmlReturn_t (*event_set_free_)(nvmlEventSet_t) = nullptr;
  nvmlEventSet_t events_ = nullptr;
  std::vector<nvmlDevice_t> registered_;  // devices registered in events_ (or tried)
};

class FakeMonitor final : public GpuMonitor {
 public:
  explicit FakeMonitor(std::string path) : path_(std::move(path)) {}

  bool available() const override { return true; }

  std::string Describe() const override { return absl::StrCat("the fake GPU file ", path_); }

  absl::StatusOr<std::vector<GpuInfo>> Query() override {
    std::ifstream in(path_);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read fake GPU file ", path_));
    std::ostringstream text;
    text << in.rdbuf();
    const nlohmann::json doc =
        nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    const auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what));
    };
    if (doc.is_discarded()) return bad("not valid JSON");
    if (!doc.is_object() || !doc.contains("gpus") || !doc["gpus"].is_array()) {
      return bad("expected {\"gpus\": [...]}");
    }
    std::vector<GpuInfo> gpus;
    for (const nlohmann::json& entry : doc["gpus"]) {
      GpuInfo gpu;
      gpu.index = static_cast<int>(gpus.size());
      const std::string where = absl::StrCat("gpus[", gpu.index, "]");
      if (!entry.is_object()) return bad(where + ": expected an object");
      if (!entry.contains("uuid") || !entry["uuid"].is_string()) {
        return bad(where + ".uuid: expected a string");
      }
      gpu.uuid = entry["uuid"].get<std::string>();
      gpu.name = "Fake GPU";
      for (const auto& [key, field] :
           {std::pair{"name", &gpu.name}, std::pair{"health_error", &gpu.health_error}}) {
        if (!entry.contains(key)) continue;
        if (!entry[key].is_string())
          return bad(absl::StrCat(where, ".", key, ": expected a string"));
        *field = entry[key].get<std::string>();
      }
      for (const auto& [key, field] : {std::pair{"memory_total", &gpu.memory_total},
                                       std::pair{"memory_used", &gpu.memory_used},
                                       std::pair{"ecc_uncorrected", &gpu.ecc_uncorrected}}) {
        if (!entry.contains(key)) continue;
        if (!entry[key].is_number_integer() || entry[key].get<int64_t>() < 0) {
          return bad(absl::StrCat(where, ".", key, ": expected a non-negative integer"));
        }
        *field = entry[key].get<int64_t>();
      }
      for (const auto& [key, field] :
           {std::pair{"compute_pids", &gpu.compute_pids}, std::pair{"xids", &gpu.xids}}) {
        if (!entry.contains(key)) continue;
        const nlohmann::json& values = entry[key];
        if (!values.is_array()) return bad(absl::StrCat(where, ".", key, ": expected an array"));
        for (const nlohmann::json& v : values) {
          if (!v.is_number_integer())
            return bad(absl::StrCat(where, ".", key, ": expected integers"));
          field->push_back(v.get<int>());
        }
      }
      std::sort(gpu.compute_pids.begin(), gpu.compute_pids.end());
      for (const auto& [key, field] :
           {std::pair{"lost", &gpu.lost},
            std::pair{"retired_pages_pending", &gpu.retired_pages_pending}}) {
        if (!entry.contains(key)) continue;
        if (!entry[key].is_boolean()) {
          return bad(absl::StrCat(where, ".", key, ": expected a boolean"));
        }
        *field = entry[key].get<bool>();
      }
      gpus.push_back(std::move(gpu));
    }
    return gpus;
  }

 private:
  std::string path_;
};

}  // namespace

GpuMonitor::~GpuMonitor() = default;

std::unique_ptr<GpuMonitor> OpenNvmlMonitor(const std::string& library) {
  return std::make_unique<NvmlMonitor>(library);
}

std::unique_ptr<GpuMonitor> OpenFakeMonitor(const std::string& json_path) {
  return std::make_unique<FakeMonitor>(json_path);
}

}  // namespace trainsup::supervisor
