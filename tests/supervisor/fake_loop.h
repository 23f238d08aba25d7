// A daemon loop's clock and timers faked (UnitClock and UnitTimers,
// supervisor/run/unit_env.h), for the unit tests of the loop-thread objects
// (RunUnit, ClusterMember): time moves only when a test says so. Off-loop
// work runs at once on the caller's thread and its result as a timer due
// now; what another thread posts waits for the test's next Advance.
#ifndef TRAINSUP_TESTS_SUPERVISOR_FAKE_LOOP_H_
#define TRAINSUP_TESTS_SUPERVISOR_FAKE_LOOP_H_

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "supervisor/run/unit_env.h"

namespace trainsup::supervisor {

class FakeLoop : public UnitClock, public UnitTimers {
 public:
  // Clock.
  double NowS() override { return now_; }
  int64_t WallMs() override { return 1'700'000'000'000 + static_cast<int64_t>(now_ * 1000); }
  uint64_t BootTicks() override { return 100000 + static_cast<uint64_t>(now_ * 100); }
  uint64_t BootTicksAt(int64_t wall_ms) override {
    return 100000 + static_cast<uint64_t>((wall_ms - 1'700'000'000'000) / 10);
  }

  // Runs what was posted and the timers due by now + dt, in order, with
  // what they post and start.
  void Advance(double dt) {
    const double until = now_ + dt;
    for (;;) {
      TakePosted();
      auto next = timers_.end();
      for (auto it = timers_.begin(); it != timers_.end(); ++it) {
        if (it->second.due <= until &&
            (next == timers_.end() || it->second.due < next->second.due)) {
          next = it;
        }
      }
      if (next == timers_.end()) break;
      now_ = std::max(now_, next->second.due);
      auto fn = std::move(next->second.fn);
      timers_.erase(next);
      fn();
    }
    now_ = until;
  }
  // Timers not yet fired (posted work counts once taken).
  size_t timers_pending() const { return timers_.size(); }

  // Timers.
  TimerId Start(double delay_s, std::function<void()> fn) override {
    const TimerId id = next_timer_++;
    timers_[id] = {now_ + delay_s, std::move(fn)};
    return id;
  }
  void Cancel(TimerId id) override { timers_.erase(id); }
  void OffLoop(std::function<std::function<void()>()> work) override {
    if (defer_off_loop) {
      deferred.push_back(std::move(work));
      return;
    }
    std::function<void()> then = work();
    if (then) Start(0, std::move(then));
  }
  // With defer_off_loop, off-loop work waits in `deferred` until the test
  // runs it (RunDeferred): a call that is slow, or never ends.
  bool defer_off_loop = false;
  std::vector<std::function<std::function<void()>()>> deferred;
  void RunDeferred(size_t i) {
    std::function<std::function<void()>()> work = std::move(deferred.at(i));
    deferred.erase(deferred.begin() + static_cast<std::ptrdiff_t>(i));
    std::function<void()> then = work();
    if (then) Start(0, std::move(then));
  }
  void Post(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(posted_mu_);
    posted_.push_back(std::move(fn));
  }

 private:
  struct Timer {
    double due;
    std::function<void()> fn;
  };
  void TakePosted() {
    std::vector<std::function<void()>> posted;
    {
      std::lock_guard<std::mutex> lock(posted_mu_);
      posted.swap(posted_);
    }
    for (auto& fn : posted) Start(0, std::move(fn));
  }

  double now_ = 100;
  TimerId next_timer_ = 1;
  std::map<TimerId, Timer> timers_;
  std::mutex posted_mu_;
  std::vector<std::function<void()>> posted_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_TESTS_SUPERVISOR_FAKE_LOOP_H_
