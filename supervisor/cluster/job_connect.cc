#include "supervisor/cluster/job_connect.h"

#include <google/protobuf/util/json_util.h>

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "trainsup/v1/supervisor.pb.h"

namespace trainsup::supervisor {
namespace {

// Puts this node's key, unless another daemon holds it: a record under a
// live lease (not a final status) of another run. The same run, a daemon
// restarted before its old lease expired, takes it over. `*fatal` says who
// holds it.
absl::Status TakeNodeKey(EtcdClient& c, const std::string& key, const std::string& self,
                         int64_t lease, const std::string& run_id, std::string* fatal) {
  absl::StatusOr<EtcdSwap> put = c.PutIf(key, 0, self, lease);
  if (!put.ok()) return put.status();
  if (put->succeeded || !put->current) return absl::OkStatus();
  const EtcdKeyValue& held = *put->current;
  v1::ClusterNode other;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;
  const bool parsed = google::protobuf::util::JsonStringToMessage(held.value, &other, opts).ok();
  if (held.lease != 0 && parsed && !other.run_id().empty() && other.run_id() != run_id) {
    *fatal = absl::StrCat(
        "run ", absl::CHexEscape(other.run_id()), " is already node \"",
        absl::CHexEscape(other.node()),
        "\" of this job, under a live etcd lease (another daemon with the same "
        "cluster.node_name, or the job submitted twice to one daemon): give every daemon of the "
        "job its own cluster.node_name, and submit the job once per daemon");
    return absl::OkStatus();
  }
  return c.Put(key, self, lease).status();
}

}  // namespace

Snapshot ConnectToJob(EtcdClient& c, const ConnectArgs& a) {
  Snapshot s;
  absl::StatusOr<int64_t> lease = c.GrantLease(a.ttl_s);
  if (!lease.ok()) {
    s.status = lease.status();
    return s;
  }
  s.lease = *lease;
  if (absl::Status taken = TakeNodeKey(c, a.keys.Node(a.node), a.self, s.lease, a.run_id, &s.fatal);
      !taken.ok() || !s.fatal.empty()) {
    s.status = taken;
    s.node_taken = !s.fatal.empty();
    if (s.node_taken) (void)c.Revoke(s.lease);
    return s;
  }
  absl::StatusOr<EtcdSwap> spec = c.PutIf(a.keys.Spec(), 0, a.spec_hash);
  if (!spec.ok()) {
    s.status = spec.status();
    return s;
  }
  if (!spec->succeeded && spec->current && spec->current->value != a.spec_hash) {
    s.fatal = absl::StrCat(
        "this node's spec differs from the one the job's first node published in etcd "
        "(spec hash ",
        a.spec_hash.substr(0, 12), " vs ", spec->current->value.substr(0, 12),
        "): submit the same spec on every node");
    (void)c.Revoke(s.lease);
    return s;
  }
  GenerationRecord first;
  first.reason = "the job's first generation";
  absl::StatusOr<EtcdSwap> gen = c.PutIf(a.keys.Generation(), 0, EncodeGeneration(first));
  if (!gen.ok()) {
    s.status = gen.status();
    return s;
  }
  absl::StatusOr<EtcdRange> range = c.GetPrefix(a.keys.prefix());
  if (!range.ok()) {
    s.status = range.status();
    return s;
  }
  s.range = std::move(*range);
  return s;
}

}  // namespace trainsup::supervisor
