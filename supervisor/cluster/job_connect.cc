#include "supervisor/cluster/job_connect.h"

#include <google/protobuf/util/json_util.h>

#include <filesystem>
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

// The job's submission as this run should see it: kept, replaced when it
// has finished and this node took part (a resubmission), or refused when
// the run belongs to an earlier one. Writes nothing but the replacement.
absl::Status ChooseSubmission(EtcdClient& c, const ConnectArgs& a, Snapshot* s) {
  absl::StatusOr<EtcdRange> now = c.GetPrefix(a.keys.prefix());
  if (!now.ok()) return now.status();
  const EtcdKeyValue* current = nullptr;
  const EtcdKeyValue* generation = nullptr;
  for (const EtcdKeyValue& kv : now->kvs) {
    if (kv.key == a.keys.Submission()) current = &kv;
    if (kv.key == a.keys.Generation()) generation = &kv;
  }
  if (!a.submission.empty()) {
    // The run's own submission, unless another one took the job's keys
    // (none at all: etcd lost them, and the run's nodes put them back).
    if (current != nullptr ? current->value != a.submission : !now->kvs.empty()) {
      s->fatal = absl::StrCat("job ", a.job, " was submitted again (submission ",
                              current != nullptr ? absl::CHexEscape(current->value) : "unknown",
                              ") after this run's submission ", a.submission,
                              " ended: this run belongs to that one and is over");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<std::string>> finished =
      FinishedAndTakenPart(*now, a.keys, a.node, a.run_id);
  if (!finished.ok()) return finished.status();
  const std::optional<std::string>& ended = *finished;
  if (!ended) return absl::OkStatus();
  // A job of daemons from before submissions has none: its generation
  // guards the replacement instead.
  const EtcdKeyValue* guard = current != nullptr ? current : generation;
  absl::StatusOr<bool> replaced = c.ReplacePrefix(a.keys.prefix(), guard->key, guard->mod_revision,
                                                  a.keys.Submission(), a.fresh);
  if (!replaced.ok()) return replaced.status();
  // Not replaced: another node replaced it first; this run joins that one.
  if (*replaced) {
    s->replaced = absl::StrCat("submission ",
                               current != nullptr ? absl::CHexEscape(current->value) : "(unnamed)",
                               " ", *ended);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<std::string>> FinishedAndTakenPart(const EtcdRange& range,
                                                                const JobKeys& keys,
                                                                const std::string& node,
                                                                const std::string& run_id) {
  std::optional<GenerationRecord> gen;
  bool took_part = false;
  int final_succeeded = 0;
  bool running = false;  // a node key under a live lease, or not a success
  std::string live;      // a node whose key is under a live lease
  for (const EtcdKeyValue& kv : range.kvs) {
    const JobKeys::Parsed p = keys.Parse(kv.key);
    if (p.kind == "generation") {
      absl::StatusOr<GenerationRecord> g = DecodeGeneration(kv.value);
      if (g.ok()) gen = *g;
    } else if (p.kind == "node") {
      v1::ClusterNode n;
      google::protobuf::util::JsonParseOptions opts;
      opts.ignore_unknown_fields = true;
      const bool parsed = google::protobuf::util::JsonStringToMessage(kv.value, &n, opts).ok();
      if (p.node == node && parsed && !n.run_id().empty() && n.run_id() != run_id) {
        took_part = true;
      }
      if (kv.lease != 0) live = p.node;
      if (kv.lease == 0 && parsed && n.state() == v1::RUN_STATE_SUCCEEDED) {
        ++final_succeeded;
      } else {
        running = true;
      }
    }
  }
  if (!took_part || !gen) return std::nullopt;
  std::optional<std::string> ended;
  if (gen->action == GenerationRecord::Action::kFail) ended = "failed: " + gen->reason;
  if (gen->action == GenerationRecord::Action::kCancel) ended = "was cancelled: " + gen->reason;
  if (final_succeeded > 0 && !running) ended = "succeeded";
  if (ended && !live.empty()) {
    return absl::AbortedError(absl::StrCat(
        "the job's earlier submission ", *ended, ", but its run on node ", absl::CHexEscape(live),
        " is still stopping (its etcd lease is live): waiting for it before a new submission "
        "replaces it"));
  }
  return ended;
}

Snapshot ConnectToJob(EtcdClient& c, const ConnectArgs& a) {
  Snapshot s;
  if (absl::Status chosen = ChooseSubmission(c, a, &s); !chosen.ok() || !s.fatal.empty()) {
    s.status = chosen;
    return s;
  }
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
  const std::string mine = a.submission.empty() ? a.fresh : a.submission;
  absl::StatusOr<EtcdSwap> sub = c.PutIf(a.keys.Submission(), 0, mine);
  if (!sub.ok()) {
    s.status = sub.status();
    return s;
  }
  s.submission = sub->succeeded || !sub->current ? mine : sub->current->value;
  if (!a.submission.empty() && s.submission != a.submission) {
    // Replaced between the choice and now.
    s.fatal = absl::StrCat(
        "job ", a.job, " was submitted again (submission ", absl::CHexEscape(s.submission),
        "): this run belongs to its earlier submission ", a.submission, " and is over");
    (void)c.Revoke(s.lease);
    return s;
  }
  if (s.submission != mine) s.replaced.clear();  // another node's new submission
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

absl::Status CheckSharedStore(const std::optional<ckpt::StoreOwner>& owner, const ClusterSpec& spec,
                              const std::string& node, const std::string& submission,
                              const std::map<std::string, JoinRecord>& joined) {
  const std::string& dir = spec.checkpoint_dir;
  if (owner) {
    if (owner->job != spec.job) {
      return absl::FailedPreconditionError(
          absl::StrCat("cluster.checkpoint_dir ", dir, " holds the checkpoints of job \"",
                       absl::CHexEscape(owner->job), "\" (its ", ckpt::kOwnerFileName,
                       "): two jobs must not share a checkpoint directory"));
    }
    if (owner->submission != submission && !spec.adopt_checkpoints) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cluster.checkpoint_dir ", dir, " holds the checkpoints of an earlier submission (",
          absl::CHexEscape(owner->submission), ") of job ", spec.job,
          ", which has ended: this submission is a new job; give it an empty checkpoint_dir, "
          "move those checkpoints away, or set cluster.adopt_checkpoints = true to go on from "
          "them"));
    }
    return absl::OkStatus();
  }
  for (const auto& [other, r] : joined) {
    if (other != node && !r.sees.empty() && r.sees == submission) {
      // Maybe only not yet (node 0 just wrote it; a cache): read again.
      return absl::UnavailableError(
          absl::StrCat("node ", node, " cannot see the job's checkpoints: node ", other,
                       " finds this submission's ", ckpt::kOwnerFileName, " in ", dir,
                       ", this node finds none there: is the shared storage mounted here?"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStoreAtSubmit(const ClusterSpec& spec) {
  std::error_code ec;
  if (std::filesystem::is_symlink(std::filesystem::symlink_status(spec.checkpoint_dir, ec))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.checkpoint_dir ", spec.checkpoint_dir,
        " is a symbolic link: refused, it may point anywhere (give the directory's real path)"));
  }
  absl::StatusOr<std::optional<ckpt::StoreOwner>> owner = ckpt::ReadStoreOwner(spec.checkpoint_dir);
  if (!owner.ok() || !*owner || (*owner)->job == spec.job) return absl::OkStatus();
  const absl::Status other = CheckSharedStore(*owner, spec, "", "", {});
  return absl::InvalidArgumentError(
      absl::StrCat(other.message(), "; give job ", spec.job, " its own"));
}

}  // namespace trainsup::supervisor
