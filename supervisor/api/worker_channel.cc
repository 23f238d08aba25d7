#include "supervisor/api/worker_channel.h"

#include "supervisor/api/api_service.h"

namespace trainsup::supervisor {

namespace wv1 = ::trainsup::worker::v1;

WorkerStream::WorkerStream(WorkerChannelBackend* backend)
    : backend_(backend),
      outbox_([this](const wv1::SupervisorCommand* c) { StartWrite(c); },
              [this](const grpc::Status& s) { Finish(s); }, 1000) {}

void WorkerStream::Begin(std::shared_ptr<WorkerStream> self) {
  self_ = self;
  weak_ = self;
  backend_->OnConnected(self);
  StartRead(&incoming_);
}

void WorkerStream::OnReadDone(bool ok) {
  if (!ok) {
    outbox_.Finish(grpc::Status::OK);
    return;
  }
  if (auto self = weak_.lock()) backend_->OnMessage(self, incoming_);
  StartRead(&incoming_);
}

void WorkerStream::OnDone() {
  outbox_.Detach();
  if (auto self = weak_.lock()) backend_->OnClosed(self);
  self_.reset();  // may delete this
}

void WorkerStream::Close(const absl::Status& status) { outbox_.Finish(ToGrpc(status)); }

grpc::ServerBidiReactor<wv1::WorkerMessage, wv1::SupervisorCommand>* WorkerChannelService::Connect(
    grpc::CallbackServerContext*) {
  auto stream = std::make_shared<WorkerStream>(backend_);
  stream->Begin(stream);
  return stream.get();
}

}  // namespace trainsup::supervisor
