#include "supervisor/store/store_thread.h"

namespace trainsup::supervisor {

absl::Status ApplyBatch(StateStore& store, const std::string& run_id, StoreBatch* batch) {
  return store.Transaction([&]() -> absl::Status {
    if (batch->run) {
      if (absl::Status s = store.UpdateRun(*batch->run); !s.ok()) return s;
    }
    for (const v1::Attempt& a : batch->attempts) {
      if (absl::Status s = store.UpsertAttempt(run_id, a); !s.ok()) return s;
    }
    for (const StoreBatch::Rank& r : batch->ranks) {
      if (absl::Status s = store.UpsertRank(run_id, r.attempt, r.status, r.priv); !s.ok()) return s;
    }
    if (batch->learning) {
      if (absl::Status s = store.SetLearning(run_id, *batch->learning); !s.ok()) return s;
    }
    for (v1::RunEvent& e : batch->events) {
      e.set_run_id(run_id);
      absl::StatusOr<int64_t> seq = store.AppendEvent(&e);
      if (!seq.ok()) return seq.status();
    }
    return absl::OkStatus();
  });
}

JobThread::JobThread(std::unique_ptr<StateStore> store)
    : store_(std::move(store)), thread_([this] { Loop(); }) {}

JobThread::~JobThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void JobThread::Post(std::function<void(StateStore&)> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void JobThread::Loop() {
  for (;;) {
    std::function<void(StateStore&)> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and drained
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job(*store_);
  }
}

absl::StatusOr<std::unique_ptr<StoreThreads>> StoreThreads::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<StateStore>> writer = StateStore::Open(path);
  if (!writer.ok()) return writer.status();
  absl::StatusOr<std::unique_ptr<StateStore>> reader = StateStore::Open(path);
  if (!reader.ok()) return reader.status();
  return std::unique_ptr<StoreThreads>(new StoreThreads(std::move(*writer), std::move(*reader)));
}

void StoreThreads::Start() {
  if (write_thread_) return;
  write_thread_ = std::make_unique<JobThread>(std::move(writer_));
  read_thread_ = std::make_unique<JobThread>(std::move(reader_));
}

void StoreThreads::Stop() {
  write_thread_.reset();
  read_thread_.reset();
}

}  // namespace trainsup::supervisor
