// One multi-node run's coordination with its job's other nodes through etcd
// (UnitCluster, unit_env.h), after TorchElastic's etcd rendezvous: a lease
// per node kept alive from the loop, a generation key moved by
// compare-and-swap, one rendezvous per generation. docs/distributed.md has
// the protocol and its failure cases; cluster_protocol.h the records.
//
// Loop-thread object, on the loop's clock and timers (unit_env.h) like a
// RunUnit. Every etcd call runs off the loop (UnitTimers::OffLoop), one at
// a time in the order issued: the next starts once the previous one's
// result is back on the loop. The lease's renewals alone go beside them,
// so that a slow call cannot let the lease expire. The watch's events come back through
// UnitTimers::Post. etcd down never blocks the loop: calls fail within the
// client's deadline, the member says so once (note, etcd_reachable()),
// keeps retrying, and decides nothing until etcd answers again. Its tests
// run it on a fake loop over the in-memory etcd (memory_etcd.h).
#ifndef TRAINSUP_SUPERVISOR_CLUSTER_CLUSTER_H_
#define TRAINSUP_SUPERVISOR_CLUSTER_CLUSTER_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "supervisor/cluster/etcd_client.h"
#include "supervisor/policy/cluster_protocol.h"
#include "supervisor/run/unit_env.h"

namespace trainsup::supervisor {

class ClusterMember final : public UnitCluster {
 public:
  struct Options {
    ClusterSpec spec;
    std::string node;       // this daemon's node name
    std::string address;    // its advertise address
    std::string run_id;     // the job's run on this node
    std::string spec_hash;  // every node's spec must hash alike
    // The job's submission the run belongs to ("" a new run: it joins the
    // current one, or starts one with `fresh_submission`, a random id).
    std::string submission;
    std::string fresh_submission;
    RestartPolicy policy;  // this daemon's, for the restarts it decides
    // An elastic job (spec.min_nodes < nodes): how long an open
    // rendezvous waits for every node before it closes with the nodes
    // that joined, if at least min_nodes ([elastic] wait_s).
    double elastic_wait_s = 60;
  };
  // `clock` and `timers` must outlive the member.
  ClusterMember(UnitClock* clock, UnitTimers* timers, std::shared_ptr<EtcdClient> client,
                Options options, ClusterEvents events);
  ~ClusterMember() override;

  void Join(int attempt, std::vector<int64_t> steps, std::optional<ckpt::StoreOwner> owner,
            int port, std::function<void(absl::StatusOr<Agreement>)> done) override;
  void Broken(int64_t generation, const AttemptEnd& end) override;
  void Verdict(int64_t generation, const AttemptEnd& end,
               std::function<void(ClusterVerdict)> done) override;
  void Withdraw(std::function<void(bool)> done) override;
  void Cancel(const std::string& reason) override;
  void Report(const v1::ClusterNode& self, bool final) override;
  void Fill(v1::ClusterStatus* out) const override;

  bool etcd_reachable() const { return etcd_up_; }

 private:
  // Queues `op` to run off the loop after the calls queued before it
  // (kInOrder), or at once beside them (kOwn: the lease's renewals); `then`
  // gets its result on the loop, unless the member is gone by then.
  enum class Path { kInOrder, kOwn };
  template <class T>
  void Do(std::function<T(EtcdClient&)> op, std::function<void(T)> then);
  template <class T>
  void Do(Path path, std::function<T(EtcdClient&)> op, std::function<void(T)> then);
  void NextCall();
  // Runs `fn` on the loop after `delay_s`, unless the member is gone.
  void After(double delay_s, std::function<void()> fn);
  double NowS() const { return clock_->NowS(); }
  double WallS() const { return static_cast<double>(clock_->WallMs()) / 1000; }
  template <class Fn>
  auto Guarded(Fn fn);

  void Connect();
  void Resync();
  void StartWatch(int64_t from_revision);
  void Apply(const EtcdKeyValue& kv, bool deleted);
  // A key of the job that is no valid record: noted, left out of the state.
  void Ignored(const EtcdKeyValue& kv, absl::string_view why);
  void Evaluate();
  void EvaluateJoin(const GenerationRecord& g);
  void KeepAlive();
  void PutJoin(int64_t generation);
  // Why the pending join cannot go on with the shared store it sees (OK:
  // it can). FailedPrecondition: the store is another job's, or an earlier
  // submission's of this one. Unavailable: another node's record of
  // `generation` sees this submission's owner record there and this node
  // none (the caller reads the store again later).
  absl::Status StoreProblem(int64_t generation);
  void OnRendezvousTimeout(int64_t generation, int64_t serial);
  // Elastic jobs: closes the open rendezvous of `generation` with the
  // nodes that joined once wait_s has passed (min_nodes at least);
  // checks again every second until it completes or fails.
  void OnElasticWait(int64_t generation, int64_t serial);
  // A node left out of the closed generation `g`: how its members ended,
  // if every one of them did (their final statuses); nullopt while any
  // runs. OK: all succeeded.
  std::optional<absl::Status> MembersEnded(const GenerationRecord& g) const;
  // This node's ranks of `generation` stopped at a checkpoint to change
  // the job's size (to take `grow_node_` in, or for a drained slot): the
  // generation moves on with `reason`, grow set (ResizeGeneration); on
  // failure `what` is noted and it tries again.
  void Resize(int64_t generation, const std::string& reason, const std::string& what);
  bool IsMember(const std::string& node) const;
  // Ends the pending join with `result` (join_ is reset first: `done` may
  // join again).
  void FinishJoin(absl::StatusOr<Agreement> result);
  void Bump(int64_t generation, AttemptEnd end, const std::string& reason);
  // Moves the job's generation record by compare-and-swap (this
  // submission's only): `next` makes the new record from the current one,
  // or nullopt when there is nothing to do (another node moved it). On
  // failure `what` is noted and `failed` runs on the loop (it retries).
  using NextRecord = std::function<std::optional<GenerationRecord>(const GenerationRecord&)>;
  void SwapJob(NextRecord next, const std::string& what, std::function<void()> failed);
  void PublishSelf();
  // An etcd call failed: Unavailable/DeadlineExceeded mark etcd down.
  void Failed(const std::string& what, const absl::Status& status);
  void Answered();

  UnitClock* clock_;
  UnitTimers* timers_;
  std::shared_ptr<EtcdClient> client_;
  Options o_;
  JobKeys keys_;
  ClusterEvents events_;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);
  std::deque<std::function<std::function<void()>()>> calls_;  // not yet started
  bool calling_ = false;                                      // one is under way
  std::set<UnitTimers::TimerId> timer_ids_;                   // not yet fired
  std::unique_ptr<EtcdWatch> watch_;

  bool connecting_ = false;
  bool connected_ = false;  // a live lease and our node key
  int64_t lease_ = 0;
  std::string fatal_;         // this node cannot take part (spec differs): the reason
  bool node_taken_ = false;   // another daemon holds this node's key: never write it
  bool fatal_told_ = false;   // a running attempt was told to stop for fatal_
  std::string waiting_note_;  // the wait for a finished submission's runs, as noted
  bool etcd_up_ = true;
  std::string etcd_error_;
  double down_since_s_ = 0;

  std::optional<GenerationRecord> gen_;
  int64_t seen_revision_ = 0;  // the state below has every change of the job up to it
  std::map<std::string, v1::ClusterNode> nodes_;  // node keys present
  std::map<std::string, int64_t> node_leases_;    // their leases
  std::set<std::string> unbound_noted_;           // join keys noted as not bound
  std::map<int64_t, std::map<std::string, JoinRecord>> joins_;
  int64_t moved_told_ = 0;  // the newest generation told through events_.moved

  struct PendingJoin {
    int attempt = 0;
    std::vector<int64_t> steps;
    std::optional<ckpt::StoreOwner> owner;
    int port = 0;
    std::function<void(absl::StatusOr<Agreement>)> done;
    int64_t put_generation = 0;  // the generation whose join record is stored
    bool putting = false;
    int64_t serial = 0;            // which Join: a timer of an earlier one is stale
    int64_t tried_generation = 0;  // the newest generation a put was tried for
    // The short generation this join was left out of (0: none): when the
    // job moves on, the run reads the store again before it joins.
    int64_t left_out_of = 0;
  };
  int64_t join_serial_ = 0;
  std::optional<PendingJoin> join_;
  int64_t last_join_generation_ = 0;  // our newest join record (deleted when superseded)
  bool withdrawing_ = false;
  int64_t running_ = 0;               // the generation whose rendezvous we completed
  std::vector<std::string> members_;  // its nodes
  std::vector<std::pair<int64_t, std::function<void(ClusterVerdict)>>> verdicts_;
  std::set<int64_t> bumping_;  // generations we are moving on
  int64_t lost_lease_generation_ = 0;
  int64_t left_out_noted_ = 0;  // the closed generation this node was told it waits out
  int64_t grow_told_ = 0;       // the short generation whose ranks were told to stop to grow
  std::string grow_node_;       // the node that joined it

  v1::ClusterNode self_;
  bool self_final_ = false;
  double self_published_s_ = -1;
  bool self_dirty_ = false;
  bool publishing_ = false;
};

// The XXH3-128 of a spec's text: the job's nodes must all run this one.
std::string SpecHash(const std::string& spec_toml);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CLUSTER_CLUSTER_H_
