// What the two files of ClusterMember share (cluster.cc: connection,
// watch, decisions, keep-alive, UnitCluster; cluster_rendezvous.cc: the
// rendezvous, its timeouts and elastic jobs): constants, small helpers and
// the member templates. Internal to supervisor/cluster/.
#ifndef TRAINSUP_SUPERVISOR_CLUSTER_CLUSTER_MEMBER_IMPL_H_
#define TRAINSUP_SUPERVISOR_CLUSTER_CLUSTER_MEMBER_IMPL_H_

#include <exception>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "supervisor/cluster/cluster.h"

namespace trainsup::supervisor {
namespace cluster_internal {

constexpr double kRetryS = 1;  // after a failed call, while etcd is down
constexpr double kPublishEveryS = 1;
constexpr double kEchoGraceS = 1;

inline bool Unreachable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

inline bool Terminal(v1::RunState s) {
  return s == v1::RUN_STATE_SUCCEEDED || s == v1::RUN_STATE_FAILED || s == v1::RUN_STATE_CANCELLED;
}

}  // namespace cluster_internal

template <class Fn>
auto ClusterMember::Guarded(Fn fn) {
  std::weak_ptr<int> life = life_;
  return [life, fn = std::move(fn)](auto&&... args) mutable {
    if (life.expired()) return;
    fn(std::forward<decltype(args)>(args)...);
  };
}

template <class T>
void ClusterMember::Do(std::function<T(EtcdClient&)> op, std::function<void(T)> then) {
  Do<T>(Path::kInOrder, std::move(op), std::move(then));
}

template <class T>
void ClusterMember::Do(Path path, std::function<T(EtcdClient&)> op, std::function<void(T)> then) {
  std::shared_ptr<EtcdClient> client = client_;
  std::weak_ptr<int> life = life_;
  const bool in_order = path == Path::kInOrder;
  auto call = [this, life, client, in_order, op = std::move(op),
               then = std::move(then)]() mutable -> std::function<void()> {
    // Off the loop: only the call, the client and the result are touched.
    // No exception leaves it (it would end the daemon): it becomes the
    // call's error.
    std::shared_ptr<T> result;
    try {
      result = std::make_shared<T>(op(*client));
    } catch (const std::exception& e) {
      result = std::make_shared<T>(absl::InternalError(absl::StrCat("etcd call: ", e.what())));
    }
    return [this, life, result, in_order, then = std::move(then)] {
      if (life.expired()) return;
      if (in_order) {
        calling_ = false;
        NextCall();
      }
      then(std::move(*result));
    };
  };
  if (!in_order) {
    timers_->OffLoop(std::move(call));
    return;
  }
  calls_.push_back(std::move(call));
  NextCall();
}

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_CLUSTER_CLUSTER_MEMBER_IMPL_H_
