// The public gRPC API (proto/trainsup/v1/supervisor.proto) on gRPC's
// callback API. Each call is authenticated first (auth.h), before anything
// of the request is looked at; then validated (a bad spec leaves no trace);
// then handed to the backend, the daemon's event loop. absl::Status is what
// the daemon speaks; this file alone turns it into grpc::Status.
#ifndef TRAINSUP_SUPERVISOR_API_API_SERVICE_H_
#define TRAINSUP_SUPERVISOR_API_API_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "contracts/daemon_config.h"
#include "contracts/spec.h"
#include "supervisor/api/watch_hub.h"
#include "trainsup/v1/supervisor.grpc.pb.h"

namespace trainsup::supervisor {

grpc::Status ToGrpc(const absl::Status& status);

// What the service checks calls against. Replaced as a whole on reload
// (an immutable snapshot, so a gRPC thread never reads a half-reloaded
// configuration).
struct ApiPolicy {
  std::vector<Token> tokens;
  std::vector<std::string> data_roots;
  int total_slots = 0;
  bool allow_fault_injection = false;
  int max_watchers_per_client = 16;
  CommandsSection commands;  // which programs a [command] run may start
  ClusterSection cluster;    // how this node reaches etcd (CheckEtcdTransport)
};

// The daemon's side. Every method is called on a gRPC thread and must hand
// the work to the event loop; `done` may be called on any thread.
class ApiBackend {
 public:
  virtual ~ApiBackend() = default;
  virtual void Submit(const v1::SubmitRunRequest& request, RunSpec spec,
                      std::function<void(absl::StatusOr<std::string> run_id)> done) = 0;
  virtual void Get(const std::string& run_id,
                   std::function<void(absl::StatusOr<v1::Run>)> done) = 0;
  virtual void List(const v1::ListRunsRequest& request,
                    std::function<void(absl::StatusOr<v1::ListRunsResponse>)> done) = 0;
  virtual void Watch(const v1::WatchRunRequest& request, std::shared_ptr<EventSink> sink) = 0;
  virtual void Cancel(const v1::CancelRunRequest& request,
                      std::function<void(absl::StatusOr<v1::Run>)> done) = 0;
  virtual void Node(std::function<void(v1::Node)> done) = 0;
  // Drains a slot, or ends an operator's drain (DrainSlot, UndrainSlot);
  // the slot as GetNode shows it afterwards.
  virtual void Drain(const v1::DrainSlotRequest& request,
                     std::function<void(absl::StatusOr<v1::Slot>)> done) = 0;
  virtual void Undrain(const v1::UndrainSlotRequest& request,
                       std::function<void(absl::StatusOr<v1::Slot>)> done) = 0;
  // Checkpoint on demand (CheckpointRun): answers once every run asked has
  // committed a checkpoint or failed, or the request's timeout passed.
  virtual void Checkpoint(const v1::CheckpointRunRequest& request,
                          std::function<void(absl::StatusOr<v1::CheckpointRunResponse>)> done) = 0;
  virtual void CountApiCall(const std::string& method, int grpc_code) = 0;
};

using SpecParser = std::function<absl::StatusOr<RunSpec>(const std::string& toml)>;

// Open WatchRun streams per client (token name, or peer address without
// tokens), shared by the services of every listening port. Thread-safe.
class WatcherCounts {
 public:
  // Counts one more stream of `client`; false (nothing counted) at `max`.
  bool Acquire(const std::string& client, int max);
  void Release(const std::string& client);
  int of(const std::string& client) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, int> counts_;
};

class SupervisorService final : public v1::Supervisor::CallbackService {
 public:
  // `policy` returns the snapshot in force. `parse` parses submitted specs
  // (ParseRunSpec; tests count its calls).
  SupervisorService(ApiBackend* backend, std::function<std::shared_ptr<const ApiPolicy>()> policy,
                    SpecParser parse, WatcherCounts* watchers);

  grpc::ServerUnaryReactor* SubmitRun(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitRunRequest* req,
                                      v1::SubmitRunResponse* resp) override;
  grpc::ServerUnaryReactor* GetRun(grpc::CallbackServerContext* ctx, const v1::GetRunRequest* req,
                                   v1::Run* resp) override;
  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx,
                                     const v1::ListRunsRequest* req,
                                     v1::ListRunsResponse* resp) override;
  grpc::ServerWriteReactor<v1::RunEvent>* WatchRun(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchRunRequest* req) override;
  grpc::ServerUnaryReactor* CancelRun(grpc::CallbackServerContext* ctx,
                                      const v1::CancelRunRequest* req, v1::Run* resp) override;
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* ctx, const v1::GetNodeRequest* req,
                                    v1::Node* resp) override;
  grpc::ServerUnaryReactor* DrainSlot(grpc::CallbackServerContext* ctx,
                                      const v1::DrainSlotRequest* req, v1::Slot* resp) override;
  grpc::ServerUnaryReactor* CheckpointRun(grpc::CallbackServerContext* ctx,
                                          const v1::CheckpointRunRequest* req,
                                          v1::CheckpointRunResponse* resp) override;
  grpc::ServerUnaryReactor* UndrainSlot(grpc::CallbackServerContext* ctx,
                                        const v1::UndrainSlotRequest* req, v1::Slot* resp) override;

 private:
  // OK, or the refusal; `client` gets the key watchers are counted under.
  absl::Status Authorize(grpc::CallbackServerContext* ctx, TokenRole role, const char* method,
                         const ApiPolicy& policy, std::string* client) const;
  absl::Status Validate(const v1::SubmitRunRequest& req, const ApiPolicy& policy,
                        RunSpec* spec) const;
  void Finish(grpc::ServerUnaryReactor* reactor, const char* method, const absl::Status& s);

  ApiBackend* backend_;
  std::function<std::shared_ptr<const ApiPolicy>()> policy_;
  SpecParser parse_;
  WatcherCounts* watchers_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_API_API_SERVICE_H_
