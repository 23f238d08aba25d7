// The multi-node protocol's data, as pure functions (docs/distributed.md
// has the protocol itself): the job's keys in etcd, the records stored at
// them (JSON), and the rendezvous agreement every node computes alike from
// the same join records. No etcd, clocks or processes: ClusterMember
// (cluster.h) reads and writes these through EtcdClient.
//
//   /trainsup/v1/jobs/JOB/submission      the submission's id (the job's identity)
//   /trainsup/v1/jobs/JOB/spec            the spec's hash, first node's
//   /trainsup/v1/jobs/JOB/generation      GenerationRecord (CAS on mod_revision)
//   /trainsup/v1/jobs/JOB/nodes/NODE      the node's status (its lease)
//   /trainsup/v1/jobs/JOB/rdzv/G/NODE     JoinRecord of generation G (its lease)
#ifndef TRAINSUP_SUPERVISOR_POLICY_CLUSTER_PROTOCOL_H_
#define TRAINSUP_SUPERVISOR_POLICY_CLUSTER_PROTOCOL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "supervisor/policy/restart_policy.h"

namespace trainsup::supervisor {

class JobKeys {
 public:
  explicit JobKeys(const std::string& job) : prefix_("/trainsup/v1/jobs/" + job + "/") {}
  const std::string& prefix() const { return prefix_; }
  std::string Submission() const { return prefix_ + "submission"; }
  std::string Spec() const { return prefix_ + "spec"; }
  std::string Generation() const { return prefix_ + "generation"; }
  std::string NodesPrefix() const { return prefix_ + "nodes/"; }
  std::string Node(const std::string& node) const { return NodesPrefix() + node; }
  std::string JoinPrefix(int64_t generation) const {
    return prefix_ + "rdzv/" + std::to_string(generation) + "/";
  }
  std::string Join(int64_t generation, const std::string& node) const {
    return JoinPrefix(generation) + node;
  }
  // What a key of the job names: kind "generation", "spec", "submission", "node" (with
  // node), "join" (with generation and node), or "" for anything else.
  struct Parsed {
    std::string kind;
    std::string node;
    int64_t generation = 0;
  };
  Parsed Parse(const std::string& key) const;

 private:
  std::string prefix_;
};

// A node's entry in a generation's rendezvous.
struct JoinRecord {
  std::string node;
  std::string run_id;   // the job's run on that node
  int attempt = 0;      // the attempt it will start
  std::string address;  // its advertise_addr
  int port = 0;         // a free port there: MASTER_PORT if it becomes node 0
  // Checkpoint steps of the shared store it verified, newest first.
  std::vector<int64_t> steps;
  // The submission the store's owner record names ("" none): the nodes
  // agree only when they all see the same.
  std::string sees;
  // The etcd lease the record is attached to (from its key, not encoded):
  // a record counts only under the lease of its node's key.
  int64_t lease = 0;
};
// The encoders never fail: bytes that are not UTF-8 (a node name from a
// key, an exit's detail) become U+FFFD.
std::string EncodeJoin(const JoinRecord& r);
absl::StatusOr<JoinRecord> DecodeJoin(const std::string& json);

// What the job does in a generation, written by whoever moved it there.
struct GenerationRecord {
  int64_t generation = 1;
  enum class Action { kRun, kFail, kCancel };
  Action action = Action::kRun;
  int64_t restarts = 0;  // restarts of the whole job so far
  double delay_s = 0;    // backoff before this generation's rendezvous
  std::string by;        // the node that wrote it ("" for generation 1)
  std::string reason;    // why the generation moved (or the job ended)
  // The job's failed generations (the restart policy's history), oldest
  // first, at most kMaxHistory, each detail at most kMaxDetailBytes (and
  // the reason kMaxReasonBytes): the record stays under 128 KiB, far below
  // etcd's 1.5 MiB request limit, whatever the exits said.
  std::vector<AttemptEnd> history;
  // An elastic job (cluster.min_nodes < nodes, docs/distributed.md,
  // "Elastic"). members: the nodes that run this generation when its
  // rendezvous was closed short at its timeout, sorted (empty: open, all
  // `nodes` must join); left_out: the job's nodes known to the closer that
  // are not among them. grow: the generation was moved after a graceful
  // stop at a checkpoint, to take a rejoining node in or because a node's
  // slot was drained (no restart counted; the name is the record's key
  // since the first). resize:
  // why the world size changes in this generation ("" unchanged).
  std::vector<std::string> members;
  std::vector<std::string> left_out;
  bool grow = false;
  std::string resize;
  static constexpr size_t kMaxHistory = 256;
  static constexpr size_t kMaxDetailBytes = 256;
  static constexpr size_t kMaxReasonBytes = 2048;
};
std::string EncodeGeneration(const GenerationRecord& r);
absl::StatusOr<GenerationRecord> DecodeGeneration(const std::string& json);

// The record that follows `current` when a node of the job saw generation
// `current.generation` fail with `end` (end.cls is not success): the
// restart policy over the job's history decides, once, for every node.
// Restart: generation + 1, kRun, restarts + 1, delay_s the backoff.
// Failure: generation + 1, kFail with the policy's reason.
GenerationRecord NextGeneration(const GenerationRecord& current, const AttemptEnd& end,
                                const RestartPolicy& policy, const std::string& by,
                                const std::string& reason);

// The record that moves generation `current.generation` on after the
// job's ranks stopped at a checkpoint to change its size (a rejoining node
// taken in, a node's drained slot): generation + 1, kRun, restarts and
// history unchanged,
// no delay, grow set, members open again, resize and reason `reason`.
GenerationRecord ResizeGeneration(const GenerationRecord& current, const std::string& by,
                                  const std::string& reason);

// The record that closes `current`'s open rendezvous with the nodes
// `joined` (sorted here), leaving out `left_out`, with `reason` as its
// resize: the same generation, everything else unchanged.
GenerationRecord CloseRendezvous(const GenerationRecord& current, std::vector<std::string> joined,
                                 std::vector<std::string> left_out, const std::string& reason);

// The rendezvous of one generation, agreed alike by every node from the
// same records: once `nodes` nodes have joined, node ranks follow the sorted
// node names, MASTER_ADDR/MASTER_PORT are node 0's, and the checkpoint is
// the newest step every node verified (-1: none, from scratch).
struct Agreement {
  int64_t generation = 0;          // the rendezvous's (set by the caller)
  std::vector<std::string> nodes;  // sorted; node rank = index
  int node_rank = -1;              // of `self`
  std::string master_addr;
  int master_port = 0;
  int64_t resume_step = -1;
  // The owner record every node sees; when it is not `submission`'s (set
  // by the caller with `claim`), node 0 writes one for `submission` before
  // its ranks start: none yet, or an earlier submission's adopted.
  std::string sees;
  bool claim = false;
  std::string submission;
  // Why the world size changes in this generation (the generation
  // record's resize, set by the caller; "" unchanged).
  std::string resize;
  // Set by the caller for a node left out of a short generation whose
  // members all succeeded meanwhile: the job is over, this node has
  // nothing to run (nodes: those members).
  bool finished = false;
};
// nullopt while fewer than `nodes` have joined, or while they do not all see
// the same owner record (a node that does not see it, with none, cannot
// see the shared store: ClusterMember fails its join). InvalidArgument when more
// have joined than the job has nodes (a misconfigured extra node: the error
// names them), or `self` is not among them.
// A closed rendezvous (`members` not empty) agrees once every member has
// joined, from the members' records alone: others that joined wait for
// the next generation, `self` among them (nullopt).
absl::StatusOr<std::optional<Agreement>> Agree(const std::vector<JoinRecord>& joined, int nodes,
                                               const std::string& self,
                                               const std::vector<std::string>& members = {});

// Why a job of `nodes` nodes fails when the rendezvous of `generation`
// has not completed within `timeout_s`, with the records `joined`: too few
// nodes, or all of them but not seeing the same owner record.
std::string RendezvousTimeoutReason(int64_t generation,
                                    const std::map<std::string, JoinRecord>& joined, int64_t nodes,
                                    double timeout_s);

// The join records that count: each attached to the lease of its node's
// key (`node_leases`), so written by the daemon that holds that key. The
// names of the others go to `unbound` (docs/distributed.md, "Security").
std::vector<JoinRecord> BoundJoins(const std::map<std::string, JoinRecord>& joins,
                                   const std::map<std::string, int64_t>& node_leases,
                                   std::vector<std::string>* unbound);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_CLUSTER_PROTOCOL_H_
