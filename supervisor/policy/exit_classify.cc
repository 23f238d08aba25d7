#include "supervisor/policy/exit_classify.h"

#include "absl/strings/str_cat.h"
#include "contracts/exit_codes.h"

namespace trainsup::supervisor {
namespace {

constexpr struct {
  ExitClass cls;
  const char* name;
} kExitClassNames[] = {
    {ExitClass::kSuccess, "success"},     {ExitClass::kUsage, "usage"},
    {ExitClass::kData, "data"},           {ExitClass::kOom, "oom"},
    {ExitClass::kStopped, "stopped"},     {ExitClass::kCrash, "crash"},
    {ExitClass::kSignal, "signal"},       {ExitClass::kFrozen, "frozen"},
    {ExitClass::kHung, "hung"},           {ExitClass::kGang, "gang"},
    {ExitClass::kCancelled, "cancelled"}, {ExitClass::kLost, "lost"},
    {ExitClass::kNoSpace, "no_space"},    {ExitClass::kPeerLost, "peer_lost"},
    {ExitClass::kDiverged, "diverged"},
};

// ClassifyAttemptEnd's order of kinds (smaller decides).
int Kind(ExitClass cls) {
  switch (cls) {
    case ExitClass::kGang:
      return 2;
    case ExitClass::kPeerLost:
      return 1;
    default:
      return 0;
  }
}

// Whether `a` decides the attempt before `b` (both did not succeed).
bool DecidesBefore(const RankOutcome& a, const RankOutcome& b) {
  if (Kind(a.cls) != Kind(b.cls)) return Kind(a.cls) < Kind(b.cls);
  const bool a_seen = a.end_order >= 0;
  const bool b_seen = b.end_order >= 0;
  if (a_seen != b_seen) return a_seen;
  if (a.end_order != b.end_order) return a.end_order < b.end_order;
  return a.rank < b.rank;
}

}  // namespace

std::string ToString(ExitClass cls) {
  for (const auto& e : kExitClassNames) {
    if (e.cls == cls) return e.name;
  }
  return absl::StrCat("exit_class(", static_cast<int>(cls), ")");
}

std::optional<ExitClass> ExitClassFromString(absl::string_view name) {
  for (const auto& e : kExitClassNames) {
    if (name == e.name) return e.cls;
  }
  return std::nullopt;
}

int ToProto(ExitClass cls) { return static_cast<int>(cls); }

std::optional<ExitClass> ExitClassFromProto(int value) {
  if (value < static_cast<int>(ExitClass::kSuccess) ||
      value > static_cast<int>(ExitClass::kDiverged)) {
    return std::nullopt;
  }
  return static_cast<ExitClass>(value);
}

ExitClass ClassifyExit(bool exited, int code_or_signal) {
  if (!exited) return ExitClass::kSignal;
  const std::optional<WorkerExit> code = WorkerExitFromStatus(code_or_signal);
  if (!code) return ExitClass::kCrash;
  switch (*code) {
    case WorkerExit::kCompleted:
      return ExitClass::kSuccess;
    case WorkerExit::kUsage:
      return ExitClass::kUsage;
    case WorkerExit::kData:
      return ExitClass::kData;
    case WorkerExit::kNoSpace:
      return ExitClass::kNoSpace;
    case WorkerExit::kOom:
      return ExitClass::kOom;
    case WorkerExit::kPeerLost:
      return ExitClass::kPeerLost;
    case WorkerExit::kDiverged:
      return ExitClass::kDiverged;
    case WorkerExit::kStopped:
      return ExitClass::kStopped;
  }
  return ExitClass::kCrash;
}

std::string DescribeExit(bool exited, int code_or_signal) {
  return absl::StrCat(exited ? "exit " : "signal ", code_or_signal);
}

bool IsStopRequest(ExitClass forced) {
  return forced == ExitClass::kCancelled || forced == ExitClass::kStopped;
}

RankEnd ClassifyRankEnd(const RankEndFacts& facts) {
  RankEnd end;
  bool known = false;
  if (facts.reaped) {
    known = true;
    end.exited = facts.exited;
    end.code = facts.exited ? facts.code_or_signal : -1;
    end.signal = facts.exited ? 0 : facts.code_or_signal;
  } else if (facts.report) {
    known = true;
    end.exited = true;
    end.code = facts.report->code;
  }
  const bool completed = known && end.exited && end.code == 0 &&
                         (facts.report || facts.said_hello || !facts.expects_hello);
  const bool answered_stop = known && end.exited && end.code == ExitStatus(WorkerExit::kStopped);
  if (facts.forced && (!IsStopRequest(*facts.forced) || answered_stop || completed)) {
    end.cls = completed ? ExitClass::kSuccess : *facts.forced;
    end.reason = facts.forced_reason;
    if (known) {
      absl::StrAppend(&end.reason, " (then ",
                      DescribeExit(end.exited, end.exited ? end.code : end.signal), ")");
    }
    return end;
  }
  const std::string while_stopping =
      facts.forced ? absl::StrCat("; while stopping: ", facts.forced_reason) : std::string();
  if (!known) {
    end.cls = ExitClass::kLost;
    end.reason =
        absl::StrCat("ended while no daemon was watching, without an exit file", while_stopping);
    return end;
  }
  end.cls = ClassifyExit(end.exited, end.exited ? end.code : end.signal);
  end.reason = DescribeExit(end.exited, end.exited ? end.code : end.signal);
  if (end.cls == ExitClass::kSuccess && !completed) {
    end.cls = ExitClass::kCrash;
    end.reason = absl::StrCat(
        "exit 0 without a hello or an exit file: not a trainsup worker completing its run",
        while_stopping);
    return end;
  }
  if (facts.report && !facts.report->message.empty()) {
    absl::StrAppend(&end.reason, ": ", facts.report->message);
  } else if (end.exited && end.code != 0) {
    if (std::optional<WorkerExit> code = WorkerExitFromStatus(end.code)) {
      absl::StrAppend(&end.reason, ": ", Describe(*code));
    }
  }
  absl::StrAppend(&end.reason, while_stopping);
  return end;
}

AttemptOutcome ClassifyAttemptEnd(const std::vector<RankOutcome>& ranks) {
  AttemptOutcome out;
  const RankOutcome* decider = nullptr;
  for (const RankOutcome& r : ranks) {
    out.made_progress = out.made_progress || r.progressed;
    if (r.cls == ExitClass::kSuccess) continue;
    if (decider == nullptr || DecidesBefore(r, *decider)) decider = &r;
  }
  if (decider == nullptr) {
    out.detail = "every rank completed";
    return out;
  }
  out.cls = decider->cls;
  const bool died = decider->cls != ExitClass::kGang && decider->cls != ExitClass::kCancelled &&
                    decider->cls != ExitClass::kStopped;
  out.detail = absl::StrCat("rank ", decider->rank, ranks.size() > 1 && died ? " died first" : "",
                            ": ", decider->reason);
  return out;
}

}  // namespace trainsup::supervisor
