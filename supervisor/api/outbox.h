// The write side of a gRPC callback stream, usable from any thread: the
// daemon's event loop pushes messages, the reactor writes them one at a time
// (the callback API allows a single outstanding write) and finishes the
// stream after the last queued message when asked to.
#ifndef TRAINSUP_SUPERVISOR_API_OUTBOX_H_
#define TRAINSUP_SUPERVISOR_API_OUTBOX_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

namespace trainsup::supervisor {

template <class Message>
class Outbox {
 public:
  // `start_write` begins writing the message (which stays alive and in
  // place until OnWriteDone); `finish` ends the stream. Both are called
  // without the lock held, and never after Detach.
  Outbox(std::function<void(const Message*)> start_write,
         std::function<void(const grpc::Status&)> finish, size_t max_queued)
      : start_write_(std::move(start_write)), finish_(std::move(finish)), max_queued_(max_queued) {}

  // Queues `message`. false (and the message dropped) when the stream is
  // finishing or gone, or when the queue is full: the reader is too slow,
  // and the stream is then finished with RESOURCE_EXHAUSTED.
  bool Push(Message message) {
    std::unique_lock<std::mutex> lock(mu_);
    if (detached_ || finish_status_) return false;
    if (queue_.size() >= max_queued_) {
      finish_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                    "the client reads too slowly; stream closed");
      queue_.clear();
      return Kick(lock), false;
    }
    queue_.push_back(std::move(message));
    Kick(lock);
    return true;
  }

  // Finishes the stream with `status` after the queued messages are written.
  void Finish(const grpc::Status& status) {
    std::unique_lock<std::mutex> lock(mu_);
    if (detached_ || finish_status_) return;
    finish_status_ = status;
    Kick(lock);
  }

  // The reactor's OnWriteDone. A failed write means the client is gone.
  void OnWriteDone(bool ok) {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) {
      queue_.clear();
      if (!finish_status_)
        finish_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
    }
    std::function<void()> drained;
    if (on_drained_ && queue_.size() <= low_water_ && !detached_ && !finish_status_) {
      drained = std::move(on_drained_);
      on_drained_ = nullptr;
    }
    Kick(lock);
    if (lock.owns_lock()) lock.unlock();
    if (drained) drained();
  }
  // Calls `fn` once (from whichever thread gets there: now, or a later
  // OnWriteDone) when at most `low_water` messages are queued. Not called
  // once the stream is finishing or gone.
  void NotifyWhenBelow(size_t low_water, std::function<void()> fn) {
    std::unique_lock<std::mutex> lock(mu_);
    if (detached_ || finish_status_) return;
    if (queue_.size() <= low_water) {
      lock.unlock();
      fn();
      return;
    }
    low_water_ = low_water;
    on_drained_ = std::move(fn);
  }
  size_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }

  // The reactor's OnDone: nothing is called back after this.
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    detached_ = true;
    queue_.clear();
  }

  bool finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return detached_ || finish_status_.has_value();
  }

 private:
  // Starts the next write, or the finish, if nothing is in flight.
  void Kick(std::unique_lock<std::mutex>& lock) {
    if (detached_ || writing_ || finish_called_) return;
    if (!queue_.empty()) {
      writing_ = true;
      const Message* next = &queue_.front();
      lock.unlock();
      start_write_(next);
      return;
    }
    if (finish_status_) {
      finish_called_ = true;
      grpc::Status status = *finish_status_;
      lock.unlock();
      finish_(status);
    }
  }

  const std::function<void(const Message*)> start_write_;
  const std::function<void(const grpc::Status&)> finish_;
  const size_t max_queued_;
  mutable std::mutex mu_;
  // References to deque elements survive push_back, so the front message
  // stays valid while it is being written.
  std::deque<Message> queue_;
  bool writing_ = false;
  bool detached_ = false;
  bool finish_called_ = false;
  std::optional<grpc::Status> finish_status_;
  size_t low_water_ = 0;
  std::function<void()> on_drained_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_API_OUTBOX_H_
