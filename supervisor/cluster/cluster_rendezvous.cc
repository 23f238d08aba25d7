// ClusterMember's rendezvous (cluster.h; docs/distributed.md, "Protocol"
// and "Several machines: nodes left out and taken in"): joining a
// generation, agreeing, the timeouts, withdrawing, and an elastic job's
// short generations and growing back.
#include <algorithm>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "supervisor/cluster/cluster.h"
#include "supervisor/cluster/cluster_member_impl.h"
#include "supervisor/cluster/job_connect.h"

namespace trainsup::supervisor {

using cluster_internal::kRetryS;
using cluster_internal::Terminal;

// The pending join against generation `g`: its record written, or the
// rendezvous complete (the agreement handed over), or the job over.
void ClusterMember::EvaluateJoin(const GenerationRecord& g) {
  // While it withdraws, the join neither completes nor moves (Withdraw
  // evaluates again once etcd answered).
  if (!join_ || !connected_ || withdrawing_) return;
  if (g.action != GenerationRecord::Action::kRun) {
    FinishJoin(g.action == GenerationRecord::Action::kCancel
                   ? absl::CancelledError(g.reason)
                   : absl::FailedPreconditionError(g.reason));
    return;
  }
  if (join_->left_out_of != 0 && g.generation > join_->left_out_of) {
    // The job moved on (to take this node in, or after a failure), after
    // checkpoints this join's steps, read before, do not list: the run
    // reads the store again and joins anew.
    FinishJoin(absl::AbortedError(absl::StrCat("the job moved to generation ", g.generation,
                                               g.grow ? " to take this node in" : "",
                                               ": reading its checkpoints again")));
    return;
  }
  if (absl::Status problem = StoreProblem(g.generation); !problem.ok()) {
    FinishJoin(problem);
    return;
  }
  if (join_->put_generation != g.generation) {
    PutJoin(g.generation);
  } else {
    std::vector<std::string> unbound;
    const std::vector<JoinRecord> joined = BoundJoins(joins_[g.generation], node_leases_, &unbound);
    for (const std::string& node : unbound) {
      if (unbound_noted_.insert(keys_.Join(g.generation, node)).second && events_.note) {
        events_.note(LogLevel::kWarn,
                     absl::StrCat("ignored the join record of node \"", absl::CHexEscape(node),
                                  "\" in generation ", g.generation,
                                  ": it is not attached to the lease of that node's key"));
      }
    }
    absl::StatusOr<std::optional<Agreement>> a =
        Agree(joined, static_cast<int>(o_.spec.nodes), o_.node, g.members);
    if (!g.members.empty() &&
        std::find(g.members.begin(), g.members.end(), o_.node) == g.members.end()) {
      join_->left_out_of = g.generation;
      if (left_out_noted_ != g.generation) {
        left_out_noted_ = g.generation;
        if (events_.note) {
          events_.note(LogLevel::kInfo,
                       absl::StrCat("generation ", g.generation, " runs without this node (",
                                    absl::StrJoin(g.members, ", "),
                                    "); waiting for it to take this node in at a checkpoint"));
        }
      }
      // The job may have ended meanwhile: nothing will take this node in.
      if (std::optional<absl::Status> ended = MembersEnded(g)) {
        if (!ended->ok()) {
          FinishJoin(*ended);
          return;
        }
        Agreement over;
        over.generation = g.generation;
        over.nodes = g.members;
        over.finished = true;
        over.submission = o_.submission;
        FinishJoin(std::move(over));
        return;
      }
    }
    if (!a.ok()) {
      if (events_.note) events_.note(LogLevel::kError, std::string(a.status().message()));
    } else if (a->has_value()) {
      Agreement agreed = **a;
      agreed.generation = g.generation;
      agreed.submission = o_.submission;
      agreed.claim = agreed.sees != o_.submission;
      agreed.resize = g.resize;
      running_ = g.generation;
      members_ = agreed.nodes;
      self_.set_node_rank(agreed.node_rank);
      self_.set_generation(g.generation);
      FinishJoin(std::move(agreed));
    }
  }
}

void ClusterMember::PutJoin(int64_t generation) {
  if (!join_ || join_->putting) return;
  join_->putting = true;
  join_->tried_generation = generation;
  JoinRecord r;
  r.node = o_.node;
  r.run_id = o_.run_id;
  r.attempt = join_->attempt;
  r.address = o_.address;
  r.port = join_->port;
  r.steps = join_->steps;
  if (join_->owner) r.sees = join_->owner->submission;
  const std::string key = keys_.Join(generation, o_.node);
  const std::string old = last_join_generation_ > 0 && last_join_generation_ != generation
                              ? keys_.Join(last_join_generation_, o_.node)
                              : "";
  const std::string value = EncodeJoin(r);
  const int64_t lease = lease_;
  Do<absl::StatusOr<int64_t>>(
      [key, old, value, lease](EtcdClient& c) -> absl::StatusOr<int64_t> {
        if (!old.empty()) (void)c.Delete(old);
        return c.Put(key, value, lease);
      },
      [this, generation](absl::StatusOr<int64_t> put) {
        if (!join_) return;
        join_->putting = false;
        if (!put.ok()) {
          Failed("joining the rendezvous", put.status());
          After(kRetryS, [this] { Evaluate(); });
          return;
        }
        Answered();
        join_->put_generation = generation;
        last_join_generation_ = generation;
        if (events_.note) {
          const size_t joined =
              joins_[generation].size() + (joins_[generation].count(o_.node) ? 0 : 1);
          events_.note(LogLevel::kInfo,
                       absl::StrCat("joined the rendezvous of generation ", generation, " (",
                                    joined, " of ", o_.spec.nodes, " nodes so far)"));
        }
        After(o_.spec.rendezvous_timeout_s, [this, generation, serial = join_->serial] {
          OnRendezvousTimeout(generation, serial);
        });
        if (o_.spec.min_nodes > 0 && o_.spec.min_nodes < o_.spec.nodes) {
          After(o_.elastic_wait_s,
                [this, generation, serial = join_->serial] { OnElasticWait(generation, serial); });
        }
        Evaluate();
      });
}

absl::Status ClusterMember::StoreProblem(int64_t generation) {
  return CheckSharedStore(join_->owner, o_.spec, o_.node, o_.submission, joins_[generation]);
}

void ClusterMember::OnRendezvousTimeout(int64_t generation, int64_t serial) {
  if (!join_ || join_->serial != serial || join_->put_generation != generation || !gen_ ||
      gen_->generation != generation) {
    return;
  }
  const std::vector<std::string>& members = gen_->members;
  if (!members.empty() && std::find(members.begin(), members.end(), o_.node) == members.end()) {
    // Left out of a short generation: the job does not fail for it. It
    // waits for the members to take it in, unless none of them is left
    // (no node key under a lease: gone, or ended), when it moves the job
    // on itself.
    bool any = false;
    for (const std::string& m : members) {
      auto it = nodes_.find(m);
      any = any || (it != nodes_.end() && it->second.lease_alive());
    }
    if (!any && gen_->action == GenerationRecord::Action::kRun) {
      AttemptEnd end;
      end.end_s = WallS();
      end.cls = ExitClass::kLost;
      end.detail = absl::StrCat("every node of generation ", generation, " (",
                                absl::StrJoin(members, ", "), ") lost: their etcd leases expired");
      Bump(generation, end, end.detail);
    }
    After(o_.spec.rendezvous_timeout_s,
          [this, generation, serial] { OnRendezvousTimeout(generation, serial); });
    return;
  }
  if (!members.empty()) {
    // A member of a closed generation whose other members did not all
    // join (a lease lost, a record withdrawn just as it closed): the job
    // restarts, and the next rendezvous leaves out whoever is missing.
    std::vector<std::string> unbound, missing;
    std::set<std::string> joined;
    for (const JoinRecord& r : BoundJoins(joins_[generation], node_leases_, &unbound)) {
      joined.insert(r.node);
    }
    for (const std::string& m : members) {
      if (joined.count(m) == 0) missing.push_back(m);
    }
    AttemptEnd end;
    end.end_s = WallS();
    end.cls = ExitClass::kLost;
    end.detail = absl::StrCat("generation ", generation, ": member",
                              missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "),
                              " did not join within ", o_.spec.rendezvous_timeout_s, " s");
    Bump(generation, end, end.detail);
    return;
  }
  const std::string reason = RendezvousTimeoutReason(generation, joins_[generation], o_.spec.nodes,
                                                     o_.spec.rendezvous_timeout_s);
  SwapJob(
      [generation, reason, by = o_.node](const GenerationRecord& g) {
        std::optional<GenerationRecord> fail;
        // Closed meanwhile (an elastic job): it no longer waits.
        if (g.generation != generation || !g.members.empty()) return fail;
        fail = g;
        fail->generation = generation + 1;
        fail->action = GenerationRecord::Action::kFail;
        fail->by = by;
        fail->reason = reason;
        return fail;
      },
      "failing the job after the rendezvous timeout",
      [this, generation, serial] {
        After(kRetryS, [this, generation, serial] { OnRendezvousTimeout(generation, serial); });
      });
}

std::optional<absl::Status> ClusterMember::MembersEnded(const GenerationRecord& g) const {
  std::vector<std::string> failed;
  for (const std::string& m : g.members) {
    auto it = nodes_.find(m);
    // A final status is written without a lease (PublishSelf).
    if (it == nodes_.end() || it->second.lease_alive() || !Terminal(it->second.state())) {
      return std::nullopt;
    }
    if (it->second.state() != v1::RUN_STATE_SUCCEEDED) {
      failed.push_back(absl::StrCat(m, ": ", v1::RunState_Name(it->second.state()), " (",
                                    it->second.reason(), ")"));
    }
  }
  if (g.members.empty()) return std::nullopt;
  if (failed.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the job ended while this node was left out of generation ", g.generation, ": ",
                   absl::StrJoin(failed, "; ")));
}

void ClusterMember::FinishJoin(absl::StatusOr<Agreement> result) {
  auto done = std::move(join_->done);
  join_.reset();
  done(std::move(result));
}

bool ClusterMember::IsMember(const std::string& node) const {
  return std::find(members_.begin(), members_.end(), node) != members_.end();
}

void ClusterMember::OnElasticWait(int64_t generation, int64_t serial) {
  if (!join_ || join_->serial != serial || join_->put_generation != generation || !gen_ ||
      gen_->generation != generation || gen_->action != GenerationRecord::Action::kRun ||
      !gen_->members.empty()) {
    return;
  }
  std::vector<std::string> unbound;
  const std::vector<JoinRecord> joined = BoundJoins(joins_[generation], node_leases_, &unbound);
  std::vector<std::string> names;
  bool same = true;
  for (const JoinRecord& r : joined) {
    names.push_back(r.node);
    same = same && r.sees == joined[0].sees;
  }
  if (static_cast<int64_t>(names.size()) >= o_.spec.nodes) return;  // completes, or fails
  if (static_cast<int64_t>(names.size()) < o_.spec.min_nodes || !same || !etcd_up_) {
    After(kRetryS, [this, generation, serial] { OnElasticWait(generation, serial); });
    return;
  }
  // The nodes of the job this daemon knows of that did not join: the last
  // running generation's, and those with a node key.
  std::set<std::string> known(members_.begin(), members_.end());
  for (const auto& [node, status] : nodes_) known.insert(node);
  for (const std::string& n : names) known.erase(n);
  const std::vector<std::string> left_out(known.begin(), known.end());
  std::string reason =
      absl::StrCat(left_out.empty() ? std::string("a node")
                                    : absl::StrCat("node ", absl::StrJoin(left_out, ", ")),
                   " left out: only ", names.size(), " of ", o_.spec.nodes,
                   " nodes joined generation ", generation, "'s rendezvous within ",
                   o_.elastic_wait_s, " s (min_nodes ", o_.spec.min_nodes, ")");
  // A node that moved the job on after its own slot was drained (its
  // reason "node B: slot ... drained (...)") is left out for that reason.
  for (const std::string& n : left_out) {
    if (gen_->grow && absl::StartsWith(gen_->reason, absl::StrCat("node ", n, ": "))) {
      absl::StrAppend(&reason, "; ", gen_->reason);
    }
  }
  SwapJob(
      [generation, names, left_out, reason](const GenerationRecord& g) {
        std::optional<GenerationRecord> closed;
        if (g.generation == generation && g.action == GenerationRecord::Action::kRun &&
            g.members.empty()) {
          closed = CloseRendezvous(g, names, left_out, reason);
        }
        return closed;
      },
      "closing the rendezvous with fewer nodes",
      [this, generation, serial] {
        After(kRetryS, [this, generation, serial] { OnElasticWait(generation, serial); });
      });
}

void ClusterMember::Resize(int64_t generation, const std::string& reason, const std::string& what) {
  if (!fatal_.empty() || !bumping_.insert(generation).second) return;
  SwapJob(
      [generation, by = o_.node, reason](const GenerationRecord& g) {
        std::optional<GenerationRecord> next;
        if (g.generation == generation && g.action == GenerationRecord::Action::kRun) {
          next = ResizeGeneration(g, by, reason);
        }
        return next;
      },
      what,
      [this, generation, reason, what] {
        bumping_.erase(generation);
        After(kRetryS, [this, generation, reason, what] { Resize(generation, reason, what); });
      });
}

void ClusterMember::Withdraw(std::function<void(bool)> done) {
  if (!join_ || join_->putting || withdrawing_) {
    done(false);
    return;
  }
  // A put that failed may have been applied: taken back like a stored one.
  const int64_t generation =
      join_->put_generation != 0 ? join_->put_generation : join_->tried_generation;
  if (generation == 0) {
    join_.reset();  // never put: nothing to take back
    done(true);
    return;
  }
  if (!connected_ || !gen_ || gen_->generation != generation ||
      joins_[generation].size() >= static_cast<size_t>(o_.spec.nodes) ||
      (!gen_->members.empty() &&
       std::find(gen_->members.begin(), gen_->members.end(), o_.node) != gen_->members.end())) {
    done(false);
    return;
  }
  // Our view has every record of the rendezvous up to seen_revision_, and
  // it is short of nodes: if no record was put since, no node saw it
  // complete from a view like ours (docs/distributed.md, "Competing jobs",
  // has the one exception), and none will once ours is gone.
  withdrawing_ = true;
  const std::string key = keys_.Join(generation, o_.node);
  const std::string prefix = keys_.JoinPrefix(generation);
  const int64_t revision = seen_revision_;
  const int64_t serial = join_->serial;
  Do<absl::StatusOr<bool>>(
      [key, prefix, revision](EtcdClient& c) { return c.DeleteIfUnchanged(key, prefix, revision); },
      [this, serial, done](absl::StatusOr<bool> out) {
        withdrawing_ = false;
        const bool mine = join_ && join_->serial == serial;
        if (!out.ok()) Failed("leaving the rendezvous", out.status());
        if (out.ok()) Answered();
        if (out.ok() && *out && mine) {
          join_.reset();
          last_join_generation_ = 0;
          done(true);
          return;
        }
        done(false);
        Evaluate();  // the agreement, if it completed meanwhile
      });
}

}  // namespace trainsup::supervisor
