// An in-memory etcd (EtcdClient, etcd_client.h), after LevelDB's memenv: the
// semantics ClusterMember relies on (one store revision bumped by every
// write, compare-and-swap on mod_revision, leases whose TTL runs on an
// injected clock, watches from a revision) without a server, plus the faults
// a test needs: etcd unavailable, a lease expired, watches broken, history
// compacted. Every client made by Client() shares the one store, as the
// nodes of a job share one etcd cluster.
//
// Thread-safe. Leases expire lazily: each call first drops the leases whose
// deadline (the clock's NowS at the last grant or keep-alive + TTL) has
// passed, with their keys. Watch events are delivered on the thread of the
// write that made them, after the store's lock is released, in revision
// order; on_end likewise on the thread that broke the watch.
#ifndef TRAINSUP_SUPERVISOR_CLUSTER_MEMORY_ETCD_H_
#define TRAINSUP_SUPERVISOR_CLUSTER_MEMORY_ETCD_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "supervisor/cluster/etcd_client.h"
#include "supervisor/run/unit_env.h"

namespace trainsup::supervisor {

class MemoryEtcd {
 public:
  // `clock` (its NowS) drives the leases; it must outlive this object.
  explicit MemoryEtcd(UnitClock* clock);
  ~MemoryEtcd();
  MemoryEtcd(const MemoryEtcd&) = delete;
  MemoryEtcd& operator=(const MemoryEtcd&) = delete;

  // A client of this store. It may outlive nothing: destroy clients (and
  // their watches) before the store.
  std::unique_ptr<EtcdClient> Client();

  // While `down`, every call fails Unavailable and every watch ends with
  // Unavailable (new watches end at once). Leases past their deadline when
  // it goes down end then; when it comes back every lease left gets its
  // full TTL again, as etcd restores leases on restart (docs/distributed.md,
  // "etcd unreachable"), so an outage by itself expires nobody.
  void SetUnavailable(bool down);
  // Drops `lease` now with its keys, as if its TTL had run out.
  void ExpireLease(int64_t lease);
  // Ends every open watch with `why` (Unavailable: the stream was lost).
  void BreakWatches(const absl::Status& why);
  // Forgets history before `revision`: watches from earlier end
  // FailedPrecondition.
  void Compact(int64_t revision);
  // The store's revision now.
  int64_t revision();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CLUSTER_MEMORY_ETCD_H_
