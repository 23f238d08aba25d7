// What the worker channel's process tests share: a temporary directory, a
// poll until a condition holds, and an in-process WorkerChannel server that
// records what workers send (link_test.cc, test_worker_test.cc).
#ifndef TRAINSUP_TESTS_INTEGRATION_LINK_TEST_UTIL_H_
#define TRAINSUP_TESTS_INTEGRATION_LINK_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainsup/v1/worker.grpc.pb.h"

namespace trainsup::worker {

using trainsup::worker::v1::SupervisorCommand;
using trainsup::worker::v1::WorkerMessage;

constexpr auto kWait = std::chrono::seconds(10);

inline std::string MakeTempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "trainsup-link-XXXXXX").string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

// Polls `done` until it holds or the deadline passes.
inline bool Eventually(const std::function<bool()>& done, std::chrono::seconds limit = kWait) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Records every message of every stream; answers each Hello with a Welcome.
class FakeSupervisor final : public trainsup::worker::v1::WorkerChannel::Service {
 public:
  explicit FakeSupervisor(int welcome_interval_ms) : welcome_interval_ms_(welcome_interval_ms) {}

  // Every Hello is answered with `status` instead of a Welcome (as trainsupd
  // answers a version it cannot serve, or a wrong token).
  void RefuseWith(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = std::move(status);
  }

  grpc::Status Connect(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<SupervisorCommand, WorkerMessage>* stream) override {
    WorkerMessage message;
    while (stream->Read(&message)) {
      std::lock_guard<std::mutex> lock(mu_);
      messages_.push_back(message);
      if (message.has_hello() && !refusal_.ok()) return refusal_;
      if (message.has_hello()) {
        stream_ = stream;
        SupervisorCommand welcome;
        welcome.mutable_welcome()->set_heartbeat_interval_ms(welcome_interval_ms_);
        stream->Write(welcome);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == stream) stream_ = nullptr;
    return grpc::Status::OK;
  }

  bool Send(const SupervisorCommand& command) {
    std::lock_guard<std::mutex> lock(mu_);
    return stream_ != nullptr && stream_->Write(command);
  }

  std::vector<WorkerMessage> Messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }

  std::vector<WorkerMessage> Of(WorkerMessage::BodyCase kind) {
    std::vector<WorkerMessage> out;
    for (auto& m : Messages()) {
      if (m.body_case() == kind) out.push_back(m);
    }
    return out;
  }

  size_t Count(WorkerMessage::BodyCase kind) { return Of(kind).size(); }

 private:
  const int welcome_interval_ms_;
  std::mutex mu_;
  grpc::Status refusal_ = grpc::Status::OK;
  std::vector<WorkerMessage> messages_;
  grpc::ServerReaderWriter<SupervisorCommand, WorkerMessage>* stream_ = nullptr;
};

class TestServer {
 public:
  TestServer(const std::string& address, int welcome_interval_ms = 20)
      : service_(welcome_interval_ms) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~TestServer() { Shutdown(); }

  bool started() const { return server_ != nullptr; }
  FakeSupervisor& service() { return service_; }

  void Shutdown() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }

 private:
  FakeSupervisor service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_TESTS_INTEGRATION_LINK_TEST_UTIL_H_
