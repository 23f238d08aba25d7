// The state store off the event loop. One thread owns the writing
// connection and runs every write in the order it was submitted (so the
// writes of one run land in the order the loop decided them); another owns
// a reading connection for the API's reads (WAL: readers see every
// committed write and never wait for the writer). A locked database or a
// slow fsync then stalls these threads, never the loop.
//
// Writes of a run go in as a StoreBatch: plain data, applied in one
// transaction, so a run's transition is stored whole or not at all, and the
// unit tests of the run lifecycle can look at exactly what was written.
#ifndef TRAINSUP_SUPERVISOR_STORE_STORE_THREAD_H_
#define TRAINSUP_SUPERVISOR_STORE_STORE_THREAD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "supervisor/store/state_store.h"

namespace trainsup::supervisor {

// One run's transition as rows to write.
struct StoreBatch {
  std::string what;                   // for errors and logs: "attempt 3 started"
  std::optional<v1::Run> run;         // UpdateRun
  std::vector<v1::Attempt> attempts;  // UpsertAttempt (ranks ignored)
  struct Rank {
    int attempt = 0;
    v1::RankStatus status;
    RankPrivate priv;
  };
  std::vector<Rank> ranks;  // UpsertRank
  std::optional<RunLearning> learning;
  std::vector<v1::RunEvent> events;  // AppendEvent; seq is filled in
  // A progress snapshot: a later one queued behind it replaces it.
  bool coalescible = false;
};

// Applies `batch` to the run `run_id` in one transaction, filling in the
// events' seq numbers. On error nothing of it is stored.
absl::Status ApplyBatch(StateStore& store, const std::string& run_id, StoreBatch* batch);

// A thread that runs jobs one at a time, in order.
class JobThread {
 public:
  explicit JobThread(std::unique_ptr<StateStore> store);
  // Runs the queued jobs to the end, then joins.
  ~JobThread();
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;
  void Post(std::function<void(StateStore&)> job);

 private:
  void Loop();
  std::unique_ptr<StateStore> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(StateStore&)>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

class StoreThreads {
 public:
  // Opens the writer connection (creating or migrating the file) and the
  // reader one. The writer is handed out by TakeForStartup() first, so the
  // daemon can load its runs synchronously before it serves; Start() then
  // moves both connections onto their threads.
  static absl::StatusOr<std::unique_ptr<StoreThreads>> Open(const std::string& path);
  StateStore& startup() { return *writer_; }
  void Start();
  // Finishes the queued jobs and joins the threads.
  void Stop();
  ~StoreThreads() { Stop(); }

  void Write(std::function<void(StateStore&)> job) { write_thread_->Post(std::move(job)); }
  void Read(std::function<void(StateStore&)> job) { read_thread_->Post(std::move(job)); }

 private:
  StoreThreads(std::unique_ptr<StateStore> writer, std::unique_ptr<StateStore> reader)
      : writer_(std::move(writer)), reader_(std::move(reader)) {}
  std::unique_ptr<StateStore> writer_, reader_;
  std::unique_ptr<JobThread> write_thread_, read_thread_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_STORE_STORE_THREAD_H_
