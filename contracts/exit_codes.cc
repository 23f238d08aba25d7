#include "contracts/exit_codes.h"

#include <iterator>

namespace trainsup {
namespace {

struct Entry {
  WorkerExit code;
  const char* name;
  const char* description;
};

constexpr Entry kEntries[] = {
    {WorkerExit::kCompleted, "completed", "run complete"},
    {WorkerExit::kUsage, "usage", "bad spec or arguments"},
    {WorkerExit::kData, "data", "data unreadable"},
    {WorkerExit::kNoSpace, "no_space", "no space left for checkpoints"},
    {WorkerExit::kOom, "oom", "hard out-of-memory"},
    {WorkerExit::kPeerLost, "peer_lost",
     "a peer rank died or stopped answering inside a collective"},
    {WorkerExit::kDiverged, "diverged", "training diverged (non-finite or spiking steps)"},
    {WorkerExit::kStopped, "stopped", "stopped on request after a checkpoint"},
};

const Entry* Find(WorkerExit code) {
  for (const Entry& e : kEntries) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

constexpr struct {
  CrashReason reason;
  const char* name;
} kCrashReasons[] = {
    {CrashReason::kCheckpointFailed, "checkpoint_failed"},
    {CrashReason::kCheckpointIo, "checkpoint_io"},
    {CrashReason::kCheckpointCorrupt, "checkpoint_corrupt"},
    {CrashReason::kError, "error"},
};

}  // namespace

std::optional<WorkerExit> WorkerExitFromStatus(int status) {
  for (const Entry& e : kEntries) {
    if (static_cast<int>(e.code) == status) return e.code;
  }
  return std::nullopt;
}

std::string ToString(WorkerExit code) {
  const Entry* e = Find(code);
  return e != nullptr ? e->name : "exit(" + std::to_string(static_cast<int>(code)) + ")";
}

std::optional<WorkerExit> WorkerExitFromString(absl::string_view name) {
  for (const Entry& e : kEntries) {
    if (name == e.name) return e.code;
  }
  return std::nullopt;
}

std::string Describe(WorkerExit code) {
  const Entry* e = Find(code);
  return e != nullptr ? e->description : "unknown exit code";
}

std::string ToString(CrashReason reason) {
  for (const auto& e : kCrashReasons) {
    if (e.reason == reason) return e.name;
  }
  return "crash(" + std::to_string(static_cast<int>(reason)) + ")";
}

std::optional<CrashReason> CrashReasonFromString(absl::string_view name) {
  for (const auto& e : kCrashReasons) {
    if (name == e.name) return e.reason;
  }
  return std::nullopt;
}

}  // namespace trainsup
