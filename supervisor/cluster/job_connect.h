// Connecting a node to its job in etcd: the blocking calls of
// ClusterMember::Connect (cluster.h), run off the loop. A lease; the node's
// key, unless another daemon is this node of the job; the spec's hash,
// which every node's must match; the job's first generation if none is
// there yet; then every key of the job, to start the watch from.
#ifndef TRAINSUP_SUPERVISOR_CLUSTER_JOB_CONNECT_H_
#define TRAINSUP_SUPERVISOR_CLUSTER_JOB_CONNECT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "supervisor/cluster/cluster_protocol.h"
#include "supervisor/cluster/etcd_client.h"

namespace trainsup::supervisor {

struct ConnectArgs {
  JobKeys keys{""};
  std::string node;       // this daemon's node name
  std::string spec_hash;  // SpecHash of the run's spec
  std::string self;       // the node's status (ClusterNode, JSON)
  int64_t ttl_s = 10;     // the lease's
  std::string run_id;     // the job's run on this node
};

// What a connection attempt found.
struct Snapshot {
  Snapshot() = default;
  Snapshot(absl::Status s) : status(std::move(s)) {}  // NOLINT: Do's error path
  absl::Status status;
  std::string fatal;        // the node cannot take part
  bool node_taken = false;  // because another daemon is this node of the job
  int64_t lease = 0;
  EtcdRange range;
};

// Status: an etcd call failed (the lease, if granted, is in `lease`), the
// caller retries. `fatal`: the node cannot take part, and its lease is
// revoked.
Snapshot ConnectToJob(EtcdClient& c, const ConnectArgs& a);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CLUSTER_JOB_CONNECT_H_
