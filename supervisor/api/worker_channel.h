// The worker channel (proto/trainsup/v1/worker.proto): one bidirectional
// stream per worker process, on gRPC's callback API. The stream only moves
// messages; the daemon's loop decides everything (which run and rank a Hello
// names, whether its token is right, when an unanswered stream is closed).
#ifndef TRAINSUP_SUPERVISOR_API_WORKER_CHANNEL_H_
#define TRAINSUP_SUPERVISOR_API_WORKER_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "supervisor/api/outbox.h"
#include "supervisor/run/unit_env.h"
#include "trainsup/v1/worker.grpc.pb.h"

namespace trainsup::supervisor {

class WorkerStream;

// The daemon's side; each call must hand the work to the loop.
class WorkerChannelBackend {
 public:
  virtual ~WorkerChannelBackend() = default;
  virtual void OnConnected(std::shared_ptr<WorkerStream> stream) = 0;
  virtual void OnMessage(std::shared_ptr<WorkerStream> stream, worker::v1::WorkerMessage m) = 0;
  virtual void OnClosed(std::shared_ptr<WorkerStream> stream) = 0;
};

class WorkerStream final
    : public grpc::ServerBidiReactor<worker::v1::WorkerMessage, worker::v1::SupervisorCommand>,
      public WorkerLink {
 public:
  explicit WorkerStream(WorkerChannelBackend* backend);
  void Begin(std::shared_ptr<WorkerStream> self);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override { outbox_.OnWriteDone(ok); }
  void OnCancel() override { outbox_.Finish(grpc::Status::CANCELLED); }
  void OnDone() override;

  // WorkerLink.
  void Send(const worker::v1::SupervisorCommand& command) override { outbox_.Push(command); }
  void Close(const absl::Status& status) override;

  // Set by the loop once a Hello was accepted (loop thread only).
  std::string run_id;
  int attempt = 0;
  int rank = -1;
  bool accepted() const { return rank >= 0; }

 private:
  WorkerChannelBackend* backend_;
  worker::v1::WorkerMessage incoming_;
  Outbox<worker::v1::SupervisorCommand> outbox_;
  std::shared_ptr<WorkerStream> self_;
  std::weak_ptr<WorkerStream> weak_;
};

class WorkerChannelService final : public worker::v1::WorkerChannel::CallbackService {
 public:
  explicit WorkerChannelService(WorkerChannelBackend* backend) : backend_(backend) {}
  grpc::ServerBidiReactor<worker::v1::WorkerMessage, worker::v1::SupervisorCommand>* Connect(
      grpc::CallbackServerContext* ctx) override;

 private:
  WorkerChannelBackend* backend_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_API_WORKER_CHANNEL_H_
