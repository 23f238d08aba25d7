#include "supervisor/policy/exit_classify.h"

#include "absl/strings/str_cat.h"
#include "contracts/exit_codes.h"

namespace trainsup::supervisor {
namespace {

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
  if (facts.forced) {
    end.cls = completed ? ExitClass::kSuccess : *facts.forced;
    end.reason = facts.forced_reason;
    if (known) {
      absl::StrAppend(&end.reason, " (then ",
                      DescribeExit(end.exited, end.exited ? end.code : end.signal), ")");
    }
    return end;
  }
  if (!known) {
    end.cls = ExitClass::kLost;
    end.reason = "ended while no daemon was watching, without an exit file";
    return end;
  }
  end.cls = ClassifyExit(end.exited, end.exited ? end.code : end.signal);
  end.reason = DescribeExit(end.exited, end.exited ? end.code : end.signal);
  if (end.cls == ExitClass::kSuccess && !completed) {
    end.cls = ExitClass::kCrash;
    end.reason = "exit 0 without a hello or an exit file: not a trainsup worker completing its run";
    return end;
  }
  if (facts.report && !facts.report->message.empty()) {
    absl::StrAppend(&end.reason, ": ", facts.report->message);
  } else if (end.exited && end.code != 0) {
    if (std::optional<WorkerExit> code = WorkerExitFromStatus(end.code)) {
      absl::StrAppend(&end.reason, ": ", Describe(*code));
    }
  }
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
