// WatchRun streams on the daemon's side: a run's history streamed from the
// store in pages (the reading connection, off the loop), as fast as the
// client reads it, then the run's live events. No watcher loads a whole
// history at once, however long it is, and a slow reader of history is
// never cut off; a live reader that falls kMaxLiveQueued events behind is
// (RESOURCE_EXHAUSTED).
//
// Gap-free handover: persisted events carry their store seq; a watcher
// turns live only once its pages reached the newest seq published on the
// loop, and drops a live event it already had from a page.
//
// Loop-thread only, except the sinks' drain callbacks (posted to the loop).
#ifndef TRAINSUP_SUPERVISOR_API_WATCH_HUB_H_
#define TRAINSUP_SUPERVISOR_API_WATCH_HUB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainsup/v1/supervisor.pb.h"

namespace trainsup::supervisor {

// A WatchRun stream.
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Queues `event`; false when the stream is closed or the reader fell too
  // far behind (the stream is then finished with RESOURCE_EXHAUSTED).
  virtual bool Push(const v1::RunEvent& event) = 0;
  virtual void Finish(const absl::Status& status) = 0;
  virtual bool finished() const = 0;
  // Calls `fn` once, on any thread, when at most `low_water` events are
  // queued.
  virtual void NotifyWhenBelow(size_t low_water, std::function<void()> fn) = 0;
};

class WatchHub {
 public:
  static constexpr int kPageSize = 1000;
  static constexpr size_t kMaxLiveQueued = 20000;

  struct Backend {
    // Reads events of `run_id` with seq > after_seq, at most `limit`, off
    // the loop; `done` runs on the loop.
    std::function<void(const std::string& run_id, int64_t after_seq, int limit,
                       std::function<void(absl::StatusOr<std::vector<v1::RunEvent>>)> done)>
        read_page;
    // Runs `fn` on the loop.
    std::function<void(std::function<void()>)> post;
    // Whether the run is live (its unit exists and has not ended).
    std::function<bool(const std::string& run_id)> live;
  };
  explicit WatchHub(Backend backend) : backend_(std::move(backend)) {}

  // A watcher of a run the store holds (`stored`, read by the caller).
  // With history: every stored event, then live ones. Without: live events
  // only; of a run that is not live, one STATE event saying how it ended.
  void Add(const v1::Run& stored, bool include_history, std::shared_ptr<EventSink> sink);

  // An event of a run: persisted (seq > 0) or live-only (seq 0). A
  // terminal STATE event finishes the run's live watchers with OK.
  void Publish(const v1::RunEvent& event);

  // Finishes every watcher with `status` (the daemon is stopping).
  void FinishAll(const absl::Status& status);

  int watchers() const;

 private:
  struct Watcher {
    std::shared_ptr<EventSink> sink;
    std::string run_id;
    int64_t next_seq = 1;
    bool live = false;
  };
  void RequestPage(const std::shared_ptr<Watcher>& w);
  void OnPage(const std::shared_ptr<Watcher>& w, absl::StatusOr<std::vector<v1::RunEvent>> page);
  void GoLive(const std::shared_ptr<Watcher>& w);

  Backend backend_;
  std::map<std::string, std::vector<std::shared_ptr<Watcher>>> live_;
  std::map<std::string, int64_t> last_seq_;  // newest persisted seq published, per run
  int backfilling_ = 0;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_API_WATCH_HUB_H_
