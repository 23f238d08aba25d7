#include "supervisor/exit_classify.h"

#include "absl/strings/str_cat.h"

namespace trainsup::supervisor {

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
  const bool completed = known && end.exited && end.code == 0 && (facts.report || facts.said_hello);
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
  }
  return end;
}

AttemptOutcome ClassifyAttemptEnd(const std::vector<RankOutcome>& ranks) {
  AttemptOutcome out;
  for (const RankOutcome& r : ranks) {
    out.made_progress = out.made_progress || r.progressed;
    if (r.cls == ExitClass::kSuccess) continue;
    if (out.cls == ExitClass::kSuccess ||
        (out.cls == ExitClass::kGang && r.cls != ExitClass::kGang)) {
      out.cls = r.cls;
      out.detail = absl::StrCat("rank ", r.rank, ": ", r.reason);
    }
  }
  if (out.cls == ExitClass::kSuccess) out.detail = "every rank completed";
  return out;
}

}  // namespace trainsup::supervisor
