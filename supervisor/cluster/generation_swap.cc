#include "supervisor/cluster/generation_swap.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trainsup::supervisor {

// Moves the generation record at `key` by compare-and-swap: `next` gets
// the record as it is and returns the one to write, or nullopt when there
// is nothing to do (someone else moved it already). A lost race re-reads.
// No record yet: nothing to do, or with `if_absent` the record `next`
// makes of generation 0 is created (no node has joined yet).
absl::Status SwapGeneration(
    EtcdClient& c, const std::string& key,
    const std::function<std::optional<GenerationRecord>(const GenerationRecord&)>& next,
    bool if_absent, const SubmissionCheck& mine) {
  for (int tries = 0; tries < 8; ++tries) {
    if (!mine.id.empty()) {
      absl::StatusOr<std::optional<EtcdKeyValue>> sub = c.Get(mine.key);
      if (!sub.ok()) return sub.status();
      if (!sub->has_value() || (*sub)->value != mine.id) return absl::OkStatus();
    }
    absl::StatusOr<std::optional<EtcdKeyValue>> kv = c.Get(key);
    if (!kv.ok()) return kv.status();
    if (!kv->has_value() && !if_absent) return absl::OkStatus();
    GenerationRecord none;
    none.generation = 0;
    absl::StatusOr<GenerationRecord> g =
        kv->has_value() ? DecodeGeneration((*kv)->value) : absl::StatusOr<GenerationRecord>(none);
    if (!g.ok()) return g.status();
    std::optional<GenerationRecord> n = next(*g);
    if (!n) return absl::OkStatus();
    const int64_t revision = kv->has_value() ? (*kv)->mod_revision : 0;
    absl::StatusOr<EtcdSwap> swap = c.PutIf(key, revision, EncodeGeneration(*n));
    if (!swap.ok()) return swap.status();
    if (swap->succeeded) return absl::OkStatus();
  }
  return absl::AbortedError("the generation kept changing");
}

void CancelJob(std::shared_ptr<const JobCancel> job) {
  job->timers->OffLoop([job]() -> std::function<void()> {
    absl::Status s;
    try {
      s = SwapGeneration(
          *job->client, job->key,
          [&](const GenerationRecord& g) {
            std::optional<GenerationRecord> next;
            if (g.action != GenerationRecord::Action::kRun) return next;
            next = g;
            next->generation = g.generation + 1;
            next->action = GenerationRecord::Action::kCancel;
            next->by = job->by;
            next->reason = job->why;
            return next;
          },
          /*if_absent=*/true, job->mine);
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("etcd call: ", e.what()));
    }
    return [job, s] {
      job->each(s);
      const absl::StatusCode code = s.code();
      if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
          code == absl::StatusCode::kAborted) {
        job->timers->Start(job->retry_s, [job] { CancelJob(job); });
      }
    };
  });
}

}  // namespace trainsup::supervisor
