#include "supervisor/cluster/cluster.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "supervisor/cluster/cluster_member_impl.h"
#include "supervisor/cluster/generation_swap.h"
#include "supervisor/cluster/job_connect.h"

namespace trainsup::supervisor {

using cluster_internal::kEchoGraceS;
using cluster_internal::kPublishEveryS;
using cluster_internal::kRetryS;
using cluster_internal::Terminal;
using cluster_internal::Unreachable;

namespace {

std::string NodeJson(const v1::ClusterNode& n) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  (void)google::protobuf::util::MessageToJsonString(n, &out, opts);
  return out;
}

}  // namespace

std::string SpecHash(const std::string& spec_toml) {
  ckpt::Hasher h;
  h.Update(spec_toml);
  return h.HexDigest();
}

void ClusterMember::NextCall() {
  if (calling_ || calls_.empty()) return;
  calling_ = true;
  std::function<std::function<void()>()> call = std::move(calls_.front());
  calls_.pop_front();
  timers_->OffLoop(std::move(call));
}

void ClusterMember::After(double delay_s, std::function<void()> fn) {
  auto id = std::make_shared<UnitTimers::TimerId>(0);
  *id = timers_->Start(delay_s, Guarded([this, id, fn = std::move(fn)] {
                         timer_ids_.erase(*id);
                         fn();
                       }));
  timer_ids_.insert(*id);
}

ClusterMember::ClusterMember(UnitClock* clock, UnitTimers* timers,
                             std::shared_ptr<EtcdClient> client, Options options,
                             ClusterEvents events)
    : clock_(clock),
      timers_(timers),
      client_(std::move(client)),
      o_(std::move(options)),
      keys_(o_.spec.job),
      events_(std::move(events)) {
  self_.set_node(o_.node);
  self_.set_run_id(o_.run_id);
  self_.set_address(o_.address);
  self_.set_node_rank(-1);
  Connect();
  After(std::max(0.2, o_.spec.lease_ttl_s / 3), [this] { KeepAlive(); });
}

ClusterMember::~ClusterMember() {
  life_.reset();
  for (UnitTimers::TimerId id : timer_ids_) timers_->Cancel(id);
  watch_.reset();
  // Calls not yet started are dropped; one under way finishes off the loop
  // (bounded by the client's deadline) and its result is dropped. The lease
  // is revoked off the loop too, so that an etcd that is down does not hold
  // the loop. A final status, when reported, is written without the lease
  // first so that it outlives it.
  const int64_t lease = lease_;
  // Another daemon's node key is never written over.
  const std::string final_status = self_final_ && !node_taken_ ? NodeJson(self_) : "";
  if (lease == 0 && final_status.empty()) return;
  std::shared_ptr<EtcdClient> client = client_;
  const std::string key = keys_.Node(o_.node);
  timers_->OffLoop([client, lease, key, final_status]() -> std::function<void()> {
    if (!final_status.empty()) (void)client->Put(key, final_status);
    if (lease != 0) (void)client->Revoke(lease);
    return nullptr;
  });
}

// --- etcd health -----------------------------------------------------------------

void ClusterMember::Failed(const std::string& what, const absl::Status& status) {
  if (!Unreachable(status)) {
    if (events_.note) events_.note(LogLevel::kWarn, absl::StrCat(what, ": ", status.message()));
    return;
  }
  etcd_error_ = std::string(status.message());
  if (etcd_up_) {
    etcd_up_ = false;
    down_since_s_ = NowS();
    if (events_.note) {
      events_.note(LogLevel::kWarn,
                   absl::StrCat("etcd unreachable (", client_->endpoints(), "): ", what, ": ",
                                status.message(),
                                "; running ranks keep training, no restart is decided until it "
                                "answers"));
    }
  }
}

void ClusterMember::Answered() {
  if (etcd_up_) return;
  etcd_up_ = true;
  etcd_error_.clear();
  if (events_.note) {
    events_.note(LogLevel::kInfo,
                 absl::StrCat("etcd reachable again after ",
                              static_cast<int64_t>(std::round(NowS() - down_since_s_)), " s"));
  }
}

// --- connection, snapshot, watch ---------------------------------------------------

void ClusterMember::Connect() {
  if (connecting_ || !fatal_.empty()) return;
  connecting_ = true;
  ConnectArgs args;
  args.job = o_.spec.job;
  args.keys = keys_;
  args.node = o_.node;
  args.spec_hash = o_.spec_hash;
  args.self = NodeJson(self_);
  args.ttl_s = static_cast<int64_t>(std::ceil(o_.spec.lease_ttl_s));
  args.run_id = o_.run_id;
  args.submission = o_.submission;
  args.fresh = o_.fresh_submission;
  Do<Snapshot>([args](EtcdClient& c) { return ConnectToJob(c, args); },
               [this](Snapshot s) {
                 connecting_ = false;
                 if (!s.fatal.empty()) {
                   Answered();
                   node_taken_ = s.node_taken;
                   fatal_ = s.fatal;
                   if (events_.note) events_.note(LogLevel::kError, fatal_);
                   Evaluate();
                   return;
                 }
                 if (!s.status.ok()) {
                   // Waiting for the runs of a finished submission: said once.
                   const bool waiting = s.status.code() == absl::StatusCode::kAborted;
                   if (!waiting || waiting_note_ != s.status.message()) {
                     Failed("joining the job", s.status);
                   }
                   waiting_note_ = waiting ? std::string(s.status.message()) : "";
                   After(kRetryS, [this] { Connect(); });
                   return;
                 }
                 Answered();
                 lease_ = s.lease;
                 connected_ = true;
                 if (o_.submission != s.submission) {
                   // From now on, reconnects (a lost lease) keep to it.
                   o_.submission = s.submission;
                   if (events_.submission) events_.submission(s.submission, s.replaced);
                 }
                 nodes_.clear();
                 node_leases_.clear();
                 joins_.clear();
                 for (const EtcdKeyValue& kv : s.range.kvs) Apply(kv, false);
                 seen_revision_ = s.range.revision;
                 StartWatch(s.range.revision + 1);
                 if (lost_lease_generation_ > 0) {
                   AttemptEnd end;
                   end.end_s = WallS();
                   end.cls = ExitClass::kLost;
                   end.detail = absl::StrCat("node ", o_.node, " lost its etcd lease");
                   Bump(lost_lease_generation_, end, end.detail);
                   lost_lease_generation_ = 0;
                 }
                 Evaluate();
               });
}

void ClusterMember::Resync() {
  const std::string prefix = keys_.prefix();
  Do<absl::StatusOr<EtcdRange>>([prefix](EtcdClient& c) { return c.GetPrefix(prefix); },
                                [this](absl::StatusOr<EtcdRange> range) {
                                  if (!range.ok()) {
                                    Failed("reading the job's keys", range.status());
                                    After(kRetryS, [this] { Resync(); });
                                    return;
                                  }
                                  Answered();
                                  nodes_.clear();
                                  node_leases_.clear();
                                  joins_.clear();
                                  for (const EtcdKeyValue& kv : range->kvs) Apply(kv, false);
                                  seen_revision_ = range->revision;
                                  StartWatch(range->revision + 1);
                                  Evaluate();
                                });
}

void ClusterMember::StartWatch(int64_t from_revision) {
  watch_.reset();
  auto events = Guarded([this](std::vector<EtcdEvent> batch, int64_t revision) {
    for (const EtcdEvent& e : batch) Apply(e.kv, e.type == EtcdEvent::Type::kDelete);
    seen_revision_ = std::max(seen_revision_, revision);
    Evaluate();
  });
  auto ended = Guarded([this](absl::Status why) {
    watch_.reset();
    Failed("watching the job's keys", why);
    After(kRetryS, [this] { Resync(); });
  });
  UnitTimers* timers = timers_;
  watch_ = client_->Watch(
      keys_.prefix(), from_revision,
      [timers, events](const std::vector<EtcdEvent>& batch, int64_t revision) mutable {
        timers->Post([events, batch, revision]() mutable { events(batch, revision); });
      },
      [timers, ended](const absl::Status& why) mutable {
        timers->Post([ended, why]() mutable { ended(why); });
      });
}

void ClusterMember::Ignored(const EtcdKeyValue& kv, absl::string_view why) {
  // Keys come from anyone who can write to etcd: escaped, so that a note
  // is valid UTF-8 for the run's events.
  if (events_.note) {
    events_.note(LogLevel::kWarn,
                 absl::StrCat("ignored etcd key \"", absl::CHexEscape(kv.key), "\": ", why));
  }
}

void ClusterMember::Apply(const EtcdKeyValue& kv, bool deleted) {
  const JobKeys::Parsed p = keys_.Parse(kv.key);
  if (p.kind == "generation" && !deleted) {
    absl::StatusOr<GenerationRecord> g = DecodeGeneration(kv.value);
    if (g.ok()) {
      if (!gen_ || g->generation >= gen_->generation) gen_ = *g;
    } else {
      Ignored(kv, g.status().message());
    }
  } else if (p.kind == "node") {
    if (deleted) {
      nodes_.erase(p.node);
      node_leases_.erase(p.node);
      return;
    }
    node_leases_[p.node] = kv.lease;
    v1::ClusterNode n;
    google::protobuf::util::JsonParseOptions opts;
    opts.ignore_unknown_fields = true;
    if (!google::protobuf::util::JsonStringToMessage(kv.value, &n, opts).ok()) {
      Ignored(kv, "node status: not a ClusterNode in JSON");
    } else if (n.node() != p.node) {
      Ignored(kv, absl::StrCat("node status of node \"", n.node(), "\" under another name"));
    } else {
      n.set_lease_alive(kv.lease != 0);
      nodes_[p.node] = n;
    }
  } else if (p.kind == "join") {
    if (deleted) {
      auto it = joins_.find(p.generation);
      if (it != joins_.end()) it->second.erase(p.node);
      return;
    }
    absl::StatusOr<JoinRecord> j = DecodeJoin(kv.value);
    if (!j.ok()) {
      Ignored(kv, j.status().message());
    } else if (j->node != p.node) {
      Ignored(kv, absl::StrCat("join record of node \"", j->node, "\" under another name"));
    } else {
      j->lease = kv.lease;
      joins_[p.generation][p.node] = *j;
    }
  }
}

// --- decisions from the job's state ---------------------------------------------------

void ClusterMember::Evaluate() {
  if (!fatal_.empty()) {
    if (join_) {
      FinishJoin(absl::FailedPreconditionError(fatal_));
    }
    // Found out on a reconnect (the job was submitted again meanwhile): an
    // attempt under way stops, and its verdict is this failure.
    if (running_ > 0 && !fatal_told_) {
      fatal_told_ = true;
      if (events_.moved) events_.moved(running_ + 1, fatal_, false);
    }
    std::vector<std::pair<int64_t, std::function<void(ClusterVerdict)>>> ready;
    ready.swap(verdicts_);
    for (auto& [generation, done] : ready) {
      ClusterVerdict v;
      v.kind = ClusterVerdict::Kind::kFail;
      v.generation = generation + 1;
      v.restarts = gen_ ? gen_->restarts : 0;
      v.reason = fatal_;
      done(v);
    }
    return;
  }
  if (!gen_) return;
  const GenerationRecord& g = *gen_;
  if (g.generation > moved_told_) {
    moved_told_ = g.generation;
    if (g.generation > 1 && events_.moved) events_.moved(g.generation, g.reason, g.grow);
  }
  // Taken out before any is answered: an answer may ask for another.
  std::vector<std::function<void(ClusterVerdict)>> ready;
  for (auto it = verdicts_.begin(); it != verdicts_.end();) {
    if (g.generation > it->first) {
      ready.push_back(std::move(it->second));
      it = verdicts_.erase(it);
    } else {
      ++it;
    }
  }
  if (!ready.empty()) {
    ClusterVerdict v;
    v.kind = g.action == GenerationRecord::Action::kRun      ? ClusterVerdict::Kind::kRestart
             : g.action == GenerationRecord::Action::kCancel ? ClusterVerdict::Kind::kCancel
                                                             : ClusterVerdict::Kind::kFail;
    v.generation = g.generation;
    v.restarts = g.restarts;
    // Whoever can write to etcd writes the delay: at most this daemon's
    // own longest backoff, so a record cannot stall the job for days.
    v.delay_s = std::min(g.delay_s, o_.policy.max_backoff_s);
    v.reason = g.reason;
    v.grow = g.grow && g.action == GenerationRecord::Action::kRun;
    for (auto& done : ready) done(v);
  }
  EvaluateJoin(g);
  // Elastic: the generation we run in was closed short, and a node outside
  // it has joined (its daemon came back): the ranks stop at a checkpoint,
  // and their verdict moves the job on to take it in (Grow).
  if (connected_ && running_ == g.generation && g.action == GenerationRecord::Action::kRun &&
      static_cast<int64_t>(members_.size()) < o_.spec.nodes && grow_told_ != g.generation) {
    std::vector<std::string> unbound;
    for (const JoinRecord& r : BoundJoins(joins_[g.generation], node_leases_, &unbound)) {
      if (IsMember(r.node)) continue;
      grow_told_ = g.generation;
      grow_node_ = r.node;
      if (events_.note) {
        events_.note(LogLevel::kInfo,
                     absl::StrCat("node ", r.node, " joined generation ", g.generation,
                                  ", which runs without it: checkpointing and stopping to take "
                                  "it in (no restart counted)"));
      }
      if (events_.grow) events_.grow(g.generation, absl::StrCat("node ", r.node, " rejoined"));
      break;
    }
  }
  // A node of the generation we run in whose node key is gone: its lease
  // expired (daemon killed, machine down, partitioned). The job restarts
  // and waits for it in the next rendezvous.
  if (connected_ && running_ == g.generation && g.action == GenerationRecord::Action::kRun) {
    for (const std::string& m : members_) {
      if (m == o_.node || nodes_.count(m) != 0) continue;
      AttemptEnd end;
      end.end_s = WallS();
      end.cls = ExitClass::kLost;
      end.detail = absl::StrCat("node ", m, " lost: its etcd lease expired");
      Bump(running_, end,
           absl::StrCat("node ", m,
                        " lost: its etcd lease expired (daemon killed, machine down or "
                        "partitioned)"));
      break;
    }
  }
}

void ClusterMember::SwapJob(NextRecord next, const std::string& what,
                            std::function<void()> failed) {
  const std::string key = keys_.Generation();
  const SubmissionCheck mine{keys_.Submission(), o_.submission};
  Do<absl::Status>(
      [key, next = std::move(next), mine](EtcdClient& c) {
        return SwapGeneration(c, key, next, /*if_absent=*/false, mine);
      },
      [this, what, failed = std::move(failed)](absl::Status s) {
        if (s.ok()) {
          Answered();
          return;
        }
        Failed(what, s);
        failed();
      });
}

void ClusterMember::Bump(int64_t generation, AttemptEnd end, const std::string& reason) {
  if (!fatal_.empty() || !bumping_.insert(generation).second) return;
  SwapJob(
      [generation, end, reason, by = o_.node, policy = o_.policy](const GenerationRecord& g) {
        std::optional<GenerationRecord> next;
        if (g.generation == generation && g.action == GenerationRecord::Action::kRun) {
          next = NextGeneration(g, end, policy, by, reason);
        }
        return next;
      },
      absl::StrCat("restarting the job from generation ", generation),
      [this, generation, end, reason] {
        bumping_.erase(generation);
        After(kRetryS, [this, generation, end, reason] { Bump(generation, end, reason); });
      });
}

// --- keep-alive -----------------------------------------------------------------------

void ClusterMember::KeepAlive() {
  const double every = std::max(0.2, o_.spec.lease_ttl_s / 3);
  if (!connected_ || lease_ == 0) {
    After(every, [this] { KeepAlive(); });
    return;
  }
  const int64_t lease = lease_;
  // Not behind the other calls: a slow swap or connect must not let the
  // lease expire (a healthy job restarted for nothing).
  Do<absl::StatusOr<int64_t>>(
      Path::kOwn, [lease](EtcdClient& c) { return c.KeepAlive(lease); },
      [this, lease, every](absl::StatusOr<int64_t> ttl) {
        After(every, [this] { KeepAlive(); });
        if (lease != lease_) return;
        if (ttl.ok()) {
          Answered();
          if (self_dirty_) PublishSelf();
          return;
        }
        if (ttl.status().code() == absl::StatusCode::kNotFound) {
          Answered();
          if (events_.note) {
            events_.note(LogLevel::kWarn,
                         absl::StrCat("this node's etcd lease expired (not renewed for ",
                                      o_.spec.lease_ttl_s,
                                      " s: the daemon was paused or cut off): the other nodes "
                                      "count it as lost; rejoining"));
          }
          connected_ = false;
          lease_ = 0;
          // Our join record went with the lease: a pending join is put again.
          if (join_) join_->put_generation = 0;
          last_join_generation_ = 0;
          if (gen_ && running_ == gen_->generation) lost_lease_generation_ = running_;
          Connect();
          return;
        }
        Failed("renewing the node's lease", ttl.status());
      });
}

// --- UnitCluster ----------------------------------------------------------------------

void ClusterMember::Join(int attempt, std::vector<int64_t> steps,
                         std::optional<ckpt::StoreOwner> owner, int port,
                         std::function<void(absl::StatusOr<Agreement>)> done) {
  if (join_) FinishJoin(absl::CancelledError("superseded by another join"));
  join_ = PendingJoin{attempt, std::move(steps), std::move(owner), port, std::move(done), 0,
                      false,   ++join_serial_};
  if (!connected_) Connect();
  Evaluate();
}

void ClusterMember::Broken(int64_t generation, const AttemptEnd& end) {
  if (end.stop_requested && end.cls == ExitClass::kStopped) {
    // The gang stopped at a checkpoint this node asked for: the job moves
    // on with no restart counted, to take a node in, or without this
    // node's drained slot (an elastic job goes on without the node until
    // its slots are usable again; docs/distributed.md, "Elastic").
    if (grow_told_ == generation) {
      Resize(generation, absl::StrCat("node ", grow_node_, " rejoined"),
             absl::StrCat("moving the job on to take node ", grow_node_, " in"));
    } else {
      Resize(generation, absl::StrCat("node ", o_.node, ": ", end.detail),
             "moving the job on after this node's stop");
    }
    return;
  }
  // Any other end of this node's ranks is judged by the restart policy,
  // a requested stop that did not end cleanly (a crash on the way) as the
  // end it is: for the policy a requested stop would end the run.
  AttemptEnd ended = end;
  ended.stop_requested = false;
  const std::string reason = absl::StrCat("node ", o_.node, ": ", end.detail);
  if (end.cls == ExitClass::kPeerLost || end.cls == ExitClass::kGang ||
      (end.cls == ExitClass::kStopped && !end.stop_requested)) {
    // Most likely the echo of a failure on another node, whose own report
    // names the cause, or of a stop another node asked of the gang (to
    // take a node in, for its drained slot): that node gets a head start
    // to move the generation.
    After(kEchoGraceS, [this, generation, ended, reason] { Bump(generation, ended, reason); });
    return;
  }
  Bump(generation, ended, reason);
}

void ClusterMember::Verdict(int64_t generation, const AttemptEnd& end,
                            std::function<void(ClusterVerdict)> done) {
  verdicts_.emplace_back(generation, std::move(done));
  Broken(generation, end);
  Evaluate();
}

void ClusterMember::Cancel(const std::string& reason) {
  // This node takes no part in the job (another spec, another daemon's
  // node key, a replaced submission): it must not end the job of others.
  if (!fatal_.empty()) return;
  auto job = std::make_shared<JobCancel>();
  job->retry_s = kRetryS;
  job->timers = timers_;
  job->client = client_;
  job->key = keys_.Generation();
  job->why = absl::StrCat("cancelled on node ", o_.node, ": ", reason);
  job->by = o_.node;
  job->mine = SubmissionCheck{keys_.Submission(), o_.submission};
  // While the member lives its status says whether etcd answers.
  job->each = Guarded([this](const absl::Status& s) {
    if (s.ok()) {
      Answered();
    } else {
      Failed("cancelling the job", s);
    }
  });
  CancelJob(std::move(job));
}

void ClusterMember::Report(const v1::ClusterNode& self, bool final) {
  const int node_rank = self_.node_rank();
  const int64_t generation = self_.generation();
  self_ = self;
  self_.set_node(o_.node);
  self_.set_run_id(o_.run_id);
  self_.set_address(o_.address);
  self_.set_node_rank(node_rank);
  self_.set_generation(generation);
  self_.set_updated_ms(static_cast<int64_t>(WallS() * 1000));
  self_final_ = self_final_ || final || Terminal(self.state());
  self_dirty_ = true;
  if (NowS() - self_published_s_ >= kPublishEveryS || self_final_) PublishSelf();
}

void ClusterMember::PublishSelf() {
  if (!connected_ || publishing_) return;
  publishing_ = true;
  self_dirty_ = false;
  self_published_s_ = NowS();
  const std::string key = keys_.Node(o_.node);
  const std::string value = NodeJson(self_);
  // A final status outlives the lease: the job's other nodes and describe
  // see how this node ended, and its absence is never read as a loss.
  const int64_t lease = self_final_ ? 0 : lease_;
  Do<absl::StatusOr<int64_t>>(
      [key, value, lease](EtcdClient& c) { return c.Put(key, value, lease); },
      [this](absl::StatusOr<int64_t> put) {
        publishing_ = false;
        if (!put.ok()) {
          self_dirty_ = true;
          Failed("publishing the node's status", put.status());
          return;
        }
        Answered();
      });
}

void ClusterMember::Fill(v1::ClusterStatus* out) const {
  out->set_job(o_.spec.job);
  out->set_nodes_expected(static_cast<int32_t>(o_.spec.nodes));
  out->set_ranks_per_node(static_cast<int32_t>(o_.spec.ranks_per_node));
  out->set_etcd_reachable(etcd_up_);
  out->set_etcd_endpoints(client_->endpoints());
  out->set_etcd_error(etcd_up_ ? fatal_ : etcd_error_);
  out->set_this_node(o_.node);
  if (gen_) {
    out->set_generation(gen_->generation);
    out->set_restarts(static_cast<int32_t>(gen_->restarts));
    out->set_last_reason(gen_->reason);
  }
  std::map<std::string, v1::ClusterNode> all = nodes_;
  v1::ClusterNode me = self_;
  me.set_lease_alive(connected_);
  all[o_.node] = me;
  // Members of the running generation whose key is gone: lost.
  for (const std::string& m : members_) {
    if (all.count(m) != 0) continue;
    v1::ClusterNode lost;
    lost.set_node(m);
    lost.set_lease_alive(false);
    lost.set_node_rank(-1);
    auto j = joins_.find(running_);
    if (j != joins_.end() && j->second.count(m)) lost.set_run_id(j->second.at(m).run_id);
    lost.set_reason("lost: its etcd lease expired");
    all[m] = lost;
  }
  // Nodes a short generation runs without (an elastic job), not seen.
  if (gen_) {
    for (const std::string& m : gen_->left_out) {
      if (all.count(m) != 0) continue;
      v1::ClusterNode out_node;
      out_node.set_node(m);
      out_node.set_lease_alive(false);
      out_node.set_node_rank(-1);
      out_node.set_reason(absl::StrCat("left out of generation ", gen_->generation,
                                       ": taken in again when its daemon rejoins"));
      all[m] = out_node;
    }
  }
  for (const auto& [name, n] : all) *out->add_nodes() = n;
}

}  // namespace trainsup::supervisor
