#include "supervisor/api/api_service.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "supervisor/api/outbox.h"
#include "supervisor/policy/auth.h"
#include "supervisor/policy/command_policy.h"

namespace trainsup::supervisor {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// A WatchRun stream: the loop (WatchHub) pushes events, the reactor writes
// them. Owns itself until OnDone.
class WatchStream final : public grpc::ServerWriteReactor<v1::RunEvent>, public EventSink {
 public:
  WatchStream(WatcherCounts* counts, std::string client)
      : counts_(counts),
        client_(std::move(client)),
        outbox_([this](const v1::RunEvent* e) { StartWrite(e); },
                [this](const grpc::Status& s) { Finish(s); }, WatchHub::kMaxLiveQueued) {}
  void Own(std::shared_ptr<WatchStream> self) { self_ = std::move(self); }

  void OnWriteDone(bool ok) override { outbox_.OnWriteDone(ok); }
  void OnCancel() override { outbox_.Finish(grpc::Status::CANCELLED); }
  void OnDone() override {
    outbox_.Detach();
    if (!client_.empty()) counts_->Release(client_);
    self_.reset();  // may delete this
  }

  bool Push(const v1::RunEvent& event) override { return outbox_.Push(event); }
  void Finish(const absl::Status& status) override { outbox_.Finish(ToGrpc(status)); }
  bool finished() const override { return outbox_.finished(); }
  void NotifyWhenBelow(size_t low_water, std::function<void()> fn) override {
    outbox_.NotifyWhenBelow(low_water, std::move(fn));
  }
  // The reactor's own Finish, for the outbox.
  using grpc::ServerWriteReactor<v1::RunEvent>::Finish;

 private:
  WatcherCounts* counts_;
  const std::string client_;  // "" when not counted
  Outbox<v1::RunEvent> outbox_;
  std::shared_ptr<WatchStream> self_;
};

SupervisorService::SupervisorService(ApiBackend* backend,
                                     std::function<std::shared_ptr<const ApiPolicy>()> policy,
                                     SpecParser parse, WatcherCounts* watchers)
    : backend_(backend),
      policy_(std::move(policy)),
      parse_(std::move(parse)),
      watchers_(watchers) {}

absl::Status SupervisorService::Authorize(grpc::CallbackServerContext* ctx, TokenRole role,
                                          const char* method, const ApiPolicy& policy,
                                          std::string* client) const {
  std::optional<std::string> authorization;
  auto it = ctx->client_metadata().find("authorization");
  if (it != ctx->client_metadata().end()) {
    authorization = std::string(it->second.data(), it->second.size());
  }
  AuthResult r = Authenticate(policy.tokens, authorization, role, method);
  if (client != nullptr) {
    *client = r.token_name.empty() ? absl::StrCat("peer ", ctx->peer())
                                   : absl::StrCat("token ", r.token_name);
  }
  return r.status;
}

void SupervisorService::Finish(grpc::ServerUnaryReactor* reactor, const char* method,
                               const absl::Status& s) {
  backend_->CountApiCall(method, static_cast<int>(s.code()));
  reactor->Finish(ToGrpc(s));
}

absl::Status SupervisorService::Validate(const v1::SubmitRunRequest& req, const ApiPolicy& policy,
                                         RunSpec* spec) const {
  if (req.request_id().size() > 128) {
    return absl::InvalidArgumentError("request_id: longer than 128 bytes");
  }
  absl::StatusOr<RunSpec> parsed = parse_(req.spec_toml());
  if (!parsed.ok()) return parsed.status();
  if (parsed->testing.present && !policy.allow_fault_injection) {
    return absl::InvalidArgumentError(
        "[testing]: fault injection is not allowed by this daemon (testing.allow_fault_injection "
        "is off in its configuration)");
  }
  if (absl::Status s = CheckSpecPaths(*parsed, policy.data_roots); !s.ok()) return s;
  if (parsed->has_command) {
    absl::StatusOr<CheckedProgram> program =
        AllowedProgram(parsed->command.argv[0], policy.commands);
    if (!program.ok()) return program.status();
    if (absl::Status s = CheckCommandEnv(parsed->command.env, policy.commands); !s.ok()) return s;
  }
  if (parsed->cluster.present) {
    if (absl::Status s = CheckEtcdTransport(policy.cluster, parsed->cluster.etcd_endpoints);
        !s.ok()) {
      return s;
    }
    if (parsed->cluster.ranks_per_node > policy.total_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster.ranks_per_node: ", parsed->cluster.ranks_per_node,
                       " exceeds the node's ", policy.total_slots, " slots"));
    }
  } else if (parsed->world_size > policy.total_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", parsed->world_size, " exceeds the node's ", policy.total_slots, " slots"));
  }
  *spec = std::move(*parsed);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* SupervisorService::SubmitRun(grpc::CallbackServerContext* ctx,
                                                       const v1::SubmitRunRequest* req,
                                                       v1::SubmitRunResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::shared_ptr<const ApiPolicy> policy = policy_();
  // Who asks comes first: an unauthorized caller never reaches the parser.
  if (absl::Status s = Authorize(ctx, TokenRole::kOperator, "SubmitRun", *policy, nullptr);
      !s.ok()) {
    Finish(reactor, "SubmitRun", s);
    return reactor;
  }
  RunSpec spec;
  if (absl::Status s = Validate(*req, *policy, &spec); !s.ok()) {
    Finish(reactor, "SubmitRun", absl::InvalidArgumentError(s.message()));
    return reactor;
  }
  backend_->Submit(*req, std::move(spec), [this, reactor, resp](absl::StatusOr<std::string> id) {
    if (id.ok()) resp->set_run_id(*id);
    Finish(reactor, "SubmitRun", id.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::GetRun(grpc::CallbackServerContext* ctx,
                                                    const v1::GetRunRequest* req, v1::Run* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = Authorize(ctx, TokenRole::kViewer, "GetRun", *policy_(), nullptr); !s.ok()) {
    Finish(reactor, "GetRun", s);
    return reactor;
  }
  // A viewer sees the spec without its command.env values (secrets such
  // as API keys go there); an operator, who could submit it, sees it whole.
  const bool viewer = !Authorize(ctx, TokenRole::kOperator, "GetRun", *policy_(), nullptr).ok();
  backend_->Get(req->run_id(), [this, reactor, resp, viewer](absl::StatusOr<v1::Run> run) {
    if (run.ok()) {
      *resp = std::move(*run);
      if (viewer) resp->set_spec_toml(RedactCommandEnv(resp->spec_toml()));
    }
    Finish(reactor, "GetRun", run.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::ListRuns(grpc::CallbackServerContext* ctx,
                                                      const v1::ListRunsRequest* req,
                                                      v1::ListRunsResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = Authorize(ctx, TokenRole::kViewer, "ListRuns", *policy_(), nullptr);
      !s.ok()) {
    Finish(reactor, "ListRuns", s);
    return reactor;
  }
  backend_->List(*req, [this, reactor, resp](absl::StatusOr<v1::ListRunsResponse> list) {
    if (list.ok()) *resp = std::move(*list);
    Finish(reactor, "ListRuns", list.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::CancelRun(grpc::CallbackServerContext* ctx,
                                                       const v1::CancelRunRequest* req,
                                                       v1::Run* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = Authorize(ctx, TokenRole::kOperator, "CancelRun", *policy_(), nullptr);
      !s.ok()) {
    Finish(reactor, "CancelRun", s);
    return reactor;
  }
  backend_->Cancel(*req, [this, reactor, resp](absl::StatusOr<v1::Run> run) {
    if (run.ok()) *resp = std::move(*run);
    Finish(reactor, "CancelRun", run.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::CheckpointRun(grpc::CallbackServerContext* ctx,
                                                           const v1::CheckpointRunRequest* req,
                                                           v1::CheckpointRunResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = Authorize(ctx, TokenRole::kOperator, "CheckpointRun", *policy_(), nullptr);
  if (s.ok() && req->all() == !req->run_id().empty()) {
    s = absl::InvalidArgumentError("name one run (run_id) or ask for all, not both or neither");
  } else if (s.ok() && !(req->timeout_s() >= 0 && req->timeout_s() <= 86400)) {
    s = absl::InvalidArgumentError("timeout_s: must be within 0..86400 (0: 600)");
  }
  if (!s.ok()) {
    Finish(reactor, "CheckpointRun", s);
    return reactor;
  }
  backend_->Checkpoint(*req,
                       [this, reactor, resp](absl::StatusOr<v1::CheckpointRunResponse> result) {
                         if (result.ok()) *resp = std::move(*result);
                         Finish(reactor, "CheckpointRun", result.status());
                       });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::GetNode(grpc::CallbackServerContext* ctx,
                                                     const v1::GetNodeRequest*, v1::Node* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = Authorize(ctx, TokenRole::kViewer, "GetNode", *policy_(), nullptr);
      !s.ok()) {
    Finish(reactor, "GetNode", s);
    return reactor;
  }
  backend_->Node([this, reactor, resp](v1::Node node) {
    *resp = std::move(node);
    Finish(reactor, "GetNode", absl::OkStatus());
  });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::DrainSlot(grpc::CallbackServerContext* ctx,
                                                       const v1::DrainSlotRequest* req,
                                                       v1::Slot* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::Status s = Authorize(ctx, TokenRole::kOperator, "DrainSlot", *policy_(), nullptr);
  if (s.ok() && req->reason().empty()) {
    s = absl::InvalidArgumentError("reason: required (why the slot is drained)");
  } else if (s.ok() && req->reason().size() > 1024) {
    s = absl::InvalidArgumentError("reason: longer than 1024 bytes");
  }
  if (!s.ok()) {
    Finish(reactor, "DrainSlot", s);
    return reactor;
  }
  backend_->Drain(*req, [this, reactor, resp](absl::StatusOr<v1::Slot> slot) {
    if (slot.ok()) *resp = std::move(*slot);
    Finish(reactor, "DrainSlot", slot.status());
  });
  return reactor;
}

grpc::ServerUnaryReactor* SupervisorService::UndrainSlot(grpc::CallbackServerContext* ctx,
                                                         const v1::UndrainSlotRequest* req,
                                                         v1::Slot* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::Status s = Authorize(ctx, TokenRole::kOperator, "UndrainSlot", *policy_(), nullptr);
      !s.ok()) {
    Finish(reactor, "UndrainSlot", s);
    return reactor;
  }
  backend_->Undrain(*req, [this, reactor, resp](absl::StatusOr<v1::Slot> slot) {
    if (slot.ok()) *resp = std::move(*slot);
    Finish(reactor, "UndrainSlot", slot.status());
  });
  return reactor;
}

bool WatcherCounts::Acquire(const std::string& client, int max) {
  std::lock_guard<std::mutex> lock(mu_);
  int& n = counts_[client];
  if (n >= max) return false;
  ++n;
  return true;
}

void WatcherCounts::Release(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(client);
  if (it == counts_.end()) return;
  if (--it->second <= 0) counts_.erase(it);
}

int WatcherCounts::of(const std::string& client) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(client);
  return it == counts_.end() ? 0 : it->second;
}

grpc::ServerWriteReactor<v1::RunEvent>* SupervisorService::WatchRun(
    grpc::CallbackServerContext* ctx, const v1::WatchRunRequest* req) {
  std::shared_ptr<const ApiPolicy> policy = policy_();
  std::string client;
  absl::Status s = Authorize(ctx, TokenRole::kViewer, "WatchRun", *policy, &client);
  if (s.ok() && !watchers_->Acquire(client, policy->max_watchers_per_client)) {
    s = absl::ResourceExhaustedError(
        absl::StrCat(client, " already holds ", policy->max_watchers_per_client,
                     " watch streams (daemon.max_watchers_per_client)"));
  }
  auto stream = std::make_shared<WatchStream>(watchers_, s.ok() ? client : std::string());
  stream->Own(stream);
  backend_->CountApiCall("WatchRun", static_cast<int>(s.code()));
  if (!s.ok()) {
    stream->Finish(s);
    return stream.get();
  }
  backend_->Watch(*req, stream);
  return stream.get();
}

}  // namespace trainsup::supervisor
