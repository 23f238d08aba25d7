#include "supervisor/policy/stop_stage.h"

namespace trainsup::supervisor {
namespace {

constexpr struct {
  StopStage stage;
  const char* name;
} kNames[] = {
    {StopStage::kNone, "none"},
    {StopStage::kStopCommand, "stop_command"},
    {StopStage::kSigterm, "sigterm"},
    {StopStage::kSigkill, "sigkill"},
};

}  // namespace

std::string ToString(StopStage stage) {
  for (const auto& e : kNames) {
    if (e.stage == stage) return e.name;
  }
  return "stop_stage(" + std::to_string(static_cast<int>(stage)) + ")";
}

std::optional<StopStage> StopStageFromString(absl::string_view name) {
  for (const auto& e : kNames) {
    if (name == e.name) return e.stage;
  }
  return std::nullopt;
}

StopStage FirstStopStage(bool graceful, bool has_stream) {
  return graceful && has_stream ? StopStage::kStopCommand : StopStage::kSigterm;
}

StopStage NextStopStage(StopStage stage) {
  switch (stage) {
    case StopStage::kStopCommand:
      return StopStage::kSigterm;
    case StopStage::kSigterm:
      return StopStage::kSigkill;
    case StopStage::kSigkill:
    case StopStage::kNone:
      return StopStage::kNone;
  }
  return StopStage::kNone;
}

double StopStageTimeout(StopStage stage, const StopTimeouts& timeouts) {
  switch (stage) {
    case StopStage::kStopCommand:
      return timeouts.stop_deadline_s;
    case StopStage::kSigterm:
      return timeouts.term_grace_s;
    case StopStage::kSigkill:
    case StopStage::kNone:
      return 0;
  }
  return 0;
}

}  // namespace trainsup::supervisor
