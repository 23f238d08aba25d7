// Connecting a node to its job in etcd: the blocking calls of
// ClusterMember::Connect (cluster.h), run off the loop. The job's
// submission: the one this run belongs to, or for a new run the current one,
// or, when that has finished and this node already took part in it, a new
// one in place of the old job's keys (docs/distributed.md, "Job identity").
// Then a lease; the node's key, unless another daemon is this node of the
// job; the spec's hash, which every node's must match; the job's first
// generation if none is there yet; then every key of the job, to start the
// watch from.
#ifndef TRAINSUP_SUPERVISOR_CLUSTER_JOB_CONNECT_H_
#define TRAINSUP_SUPERVISOR_CLUSTER_JOB_CONNECT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "checkpoint/store.h"
#include "contracts/spec.h"
#include "supervisor/cluster/etcd_client.h"
#include "supervisor/policy/cluster_protocol.h"

namespace trainsup::supervisor {

struct ConnectArgs {
  std::string job;
  JobKeys keys{""};
  std::string node;        // this daemon's node name
  std::string spec_hash;   // SpecHash of the run's spec
  std::string self;        // the node's status (ClusterNode, JSON)
  int64_t ttl_s = 10;      // the lease's
  std::string run_id;      // the job's run on this node
  std::string submission;  // the one the run belongs to ("" a new run)
  std::string fresh;       // a new random id, should the run start a submission
};

// What a connection attempt found.
struct Snapshot {
  Snapshot() = default;
  Snapshot(absl::Status s) : status(std::move(s)) {}  // NOLINT: Do's error path
  absl::Status status;
  std::string fatal;        // the node cannot take part
  bool node_taken = false;  // because another daemon is this node of the job
  int64_t lease = 0;
  std::string submission;  // the one joined
  std::string replaced;    // a finished submission replaced by it: how it ended
  EtcdRange range;
};

// A new run of node `node` starts a new submission of the job whose keys
// are `range`: the job has finished (its generation failed or was
// cancelled, or every node's final status is SUCCEEDED), and this node took
// part in it (its key holds another run's status). How it ended, or
// nullopt: the run joins the current submission (the job still runs, or
// this node's run is the late part of it, like a node submitted to after
// another cancelled the job). Aborted while a node's key of the finished
// job is still under a live lease (its run is stopping): the caller waits,
// so that the old runs never write into the new submission's keys.
absl::StatusOr<std::optional<std::string>> FinishedAndTakenPart(const EtcdRange& range,
                                                                const JobKeys& keys,
                                                                const std::string& node,
                                                                const std::string& run_id);

// Status: an etcd call failed (the lease, if granted, is in `lease`), the
// caller retries. `fatal`: the node cannot take part, and its lease is
// revoked.
Snapshot ConnectToJob(EtcdClient& c, const ConnectArgs& a);

// Whether this node's join may go on with the shared store as it reads it
// (`owner`: its owner record, nullopt none), for the run of `submission`:
// OK. FailedPrecondition: the store is another job's, or an earlier
// submission's of this one. Unavailable: a record of `joined` (the
// rendezvous so far) of another node sees this submission's owner record
// there and this node none (the caller reads the store again later).
absl::Status CheckSharedStore(const std::optional<ckpt::StoreOwner>& owner, const ClusterSpec& spec,
                              const std::string& node, const std::string& submission,
                              const std::map<std::string, JoinRecord>& joined);

// At submit: InvalidArgument when the spec's checkpoint_dir holds another
// job's owner record (read on the caller's thread; unreadable: OK, the
// join checks again).
absl::Status CheckStoreAtSubmit(const ClusterSpec& spec);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CLUSTER_JOB_CONNECT_H_
