// The job's generation record moved by compare-and-swap (SwapGeneration),
// and the job's cancellation retried until etcd takes it (CancelJob), for
// the cluster member (cluster.h).
#ifndef TRAINSUP_SUPERVISOR_CLUSTER_GENERATION_SWAP_H_
#define TRAINSUP_SUPERVISOR_CLUSTER_GENERATION_SWAP_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "supervisor/cluster/etcd_client.h"
#include "supervisor/policy/cluster_protocol.h"
#include "supervisor/run/unit_env.h"

namespace trainsup::supervisor {

// The submission a caller belongs to (docs/distributed.md, "Job
// identity"): when `id` is set and the job's submission key (`key`) holds
// another id, or none, the job is no longer the caller's and nothing is
// written (a member of a replaced submission must not move the new one).
struct SubmissionCheck {
  std::string key;
  std::string id;
};

// Moves the generation record at `key` by compare-and-swap: `next` gets
// the record as it is and returns the one to write, or nullopt when there
// is nothing to do (someone else moved it already). A lost race re-reads.
// No record yet: nothing to do, or with `if_absent` the record `next`
// makes of generation 0 is created (no node has joined yet).
absl::Status SwapGeneration(
    EtcdClient& c, const std::string& key,
    const std::function<std::optional<GenerationRecord>(const GenerationRecord&)>& next,
    bool if_absent = false, const SubmissionCheck& mine = {});

// The job's cancellation, written by compare-and-swap into its generation
// record and retried every kRetryS while etcd does not answer. It owns what
// it needs, so it outlives the member that started it: a run cancelled
// while etcd is down ends at once on its node, and the job's other nodes
// learn of it when etcd answers again (while this daemon runs). A job that
// no longer runs is left as it is; a job no node has joined yet is created
// cancelled, so that the nodes joining later end at once.
struct JobCancel {
  UnitTimers* timers;
  std::shared_ptr<EtcdClient> client;
  std::string key;  // the generation record
  std::string why;
  std::string by;
  SubmissionCheck mine;
  std::function<void(const absl::Status&)> each;  // every try's outcome, on the loop
  double retry_s = 1;                             // between tries while etcd is down
};

// Writes `job`'s cancellation off the loop through its timers, again after
// retry_s while etcd is Unavailable (or the swap keeps losing races).
void CancelJob(std::shared_ptr<const JobCancel> job);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CLUSTER_GENERATION_SWAP_H_
