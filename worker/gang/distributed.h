// Data-parallel training across the ranks of a run (docs/distributed.md):
// the gang's process group on PyTorch's own c10d (a TCPStore hosted by rank
// 0, ProcessGroupGloo on the CPU, ProcessGroupNCCL with a Gloo group beside
// it for host tensors when the run trains on CUDA), and the gradient allreduce in buckets that
// the last backward pass of a step launches as its gradients become ready.
//
// Every collective has a name ("gradient bucket 3/9 of step 17") and a
// sequence number; each rank records the one it entered in the store, so a
// collective that fails or times out (distributed.timeout_s) becomes a
// CollectiveError that says which collective and which peer is behind or
// stuck. With world size 1 there is no process group and every collective
// is the identity, so the training loop has one code path.
#ifndef TRAINSUP_WORKER_GANG_DISTRIBUTED_H_
#define TRAINSUP_WORKER_GANG_DISTRIBUTED_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainsup::worker {

struct GangOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: where rank 0 hosts the store
  int master_port = 0;                    // MASTER_PORT
  double timeout_s = 60;                  // a collective that takes longer fails
  double connect_timeout_s = 120;         // for the store and for the whole gang to join
  std::string backend = "auto";           // auto | gloo | nccl (distributed.backend)
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // Gloo only: build the layout of an NCCL gang (a device group and a Gloo
  // group beside it for host tensors) with Gloo in both places, so the
  // tests run it without a GPU.
  bool host_group_beside_device = false;
  // Which network Gloo binds to (ChooseGlooDevice): GLOO_SOCKET_IFNAME's
  // interfaces, else this node's advertised address (TRAINSUP_NODE_ADDR).
  std::string gloo_ifname;
  std::string node_addr;
};

// The device Gloo binds to, in this order: the interfaces `gloo_ifname`
// names (comma-separated, as torch.distributed reads GLOO_SOCKET_IFNAME),
// one device each; 127.0.0.1 when rank 0 is on loopback (one machine); the
// address this node advertises to the job (the daemon's
// cluster.advertise_addr), so a multi-homed host talks on the network its
// peers reach it on; else whatever the host name resolves to (Gloo's
// default, 127.0.1.1 on stock Debian).
struct GlooDeviceChoice {
  enum class Kind { kInterfaces, kAddress, kHostName };
  Kind kind = Kind::kHostName;
  std::vector<std::string> names;  // interfaces, or the one address
};
GlooDeviceChoice ChooseGlooDevice(const std::string& master_addr, const std::string& node_addr,
                                  const std::string& gloo_ifname);

// Which of a gang's process groups a collective on a tensor goes to. An
// NCCL gang has two: NCCL for the device's tensors and a Gloo group beside
// it for host tensors (the control tensor, the loss sums, AllGather, the
// checkpoint result), which ProcessGroupNCCL rejects. A Gloo gang has one,
// and everything goes to it (kDevice).
enum class GroupKind { kDevice, kHost };
GroupKind GroupFor(bool separate_host_group, const c10::Device& tensor_device);

// A collective that failed: its message names the collective, this rank,
// the peers that had not reached it or were stuck in it, and the backend's
// own error.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Time this rank spent in collectives (seconds, summed over a step or a
// run), for the heartbeat and the benchmark.
struct CollectiveStats {
  int64_t collectives = 0;
  double blocked_s = 0;  // waiting on the training thread for a collective to finish
  // Gradient buckets: how many were launched while backward was still
  // running, how many after it, and their time in flight (launch to
  // completion, summed; overlapped with backward when launched during it).
  int64_t buckets_in_backward = 0;
  int64_t buckets_after_backward = 0;
  double bucket_flight_s = 0;
  int64_t bytes = 0;
  // Collectives that went to the host group beside the device's (none in
  // a gang of one group).
  int64_t host_collectives = 0;
};

class Gang {
 public:
  // Joins the gang: rank 0 hosts the store at master_addr:master_port, the
  // others connect to it; every rank waits for all to join. World size 1
  // joins nothing. Errors: InvalidArgument for bad options or a backend
  // that this build lacks; DeadlineExceeded or Unavailable when the gang
  // did not assemble within connect_timeout_s (the message says where).
  static absl::StatusOr<std::unique_ptr<Gang>> Join(const GangOptions& options);
  ~Gang();
  Gang(const Gang&) = delete;
  Gang& operator=(const Gang&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& backend() const { return backend_; }  // "none" for world size 1

  // Blocking collectives; all ranks must make the same calls in the same
  // order. Throw CollectiveError. `what` names the collective for errors.
  // One tensor per call (Gloo reads a list as one tensor per device).
  void AllreduceSum(at::Tensor& tensor, const std::string& what);
  // `timeout_s` > 0 bounds this one broadcast instead of timeout_s (the
  // other ranks waiting while the root writes a checkpoint).
  void Broadcast(at::Tensor& tensor, int root, const std::string& what, double timeout_s = 0);
  void Barrier(const std::string& what);
  // Every rank's `mine`, in rank order.
  std::vector<std::string> AllGather(const std::string& mine, const std::string& what);

  // An allreduce (sum) in flight; Wait() completes it (throws
  // CollectiveError) and returns its time in flight.
  class Pending;
  std::shared_ptr<Pending> AllreduceAsync(at::Tensor tensor, const std::string& what);
  double Wait(Pending& pending);

  // Stats since the last TakeStats() call.
  CollectiveStats TakeStats();
  CollectiveStats& stats() { return stats_; }

 private:
  struct Impl;
  explicit Gang(GangOptions options);
  // Records that this rank enters collective `what` and returns its number.
  int64_t Enter(const std::string& what);
  // The error for collective `seq` `what` that failed with `cause`.
  [[noreturn]] void Fail(int64_t seq, const std::string& what, const std::string& cause);
  void CountGroup(const at::Tensor& tensor);

  GangOptions options_;
  std::string backend_ = "none";
  std::unique_ptr<Impl> impl_;
  int64_t seq_ = 0;
  CollectiveStats stats_;
};

// The gradient allreduce of a data-parallel step, in buckets of about
// `bucket_bytes` over the parameters in reverse order (the order backward
// produces their gradients). A bucket is launched (asynchronously) once all
// its gradients are final, and only after every lower-numbered bucket, so
// every rank makes the same calls in the same order. Gradients are final
// in the backward pass that completes the rank's batch (ArmFinalBackward):
// hooks on the parameters take each gradient as it arrives, add it to the
// accumulator and seal it. Finish() launches what is left (a rank whose
// batch needed no final pass launches everything there) and writes the
// sums back. World size 1: nothing is launched, Finish() does nothing.
class GradientReducer {
 public:
  // overlap = false: nothing is launched during backward (ArmFinalBackward
  // does nothing), every bucket in Finish().
  GradientReducer(Gang* gang, std::vector<at::Tensor> params, int64_t bucket_bytes,
                  bool overlap = true);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // A new step: nothing sealed; `accum` (one tensor per parameter) is where
  // the rank's gradient is being accumulated.
  void BeginStep(std::vector<at::Tensor>* accum, int64_t step);
  // The next backward completes this rank's batch: its gradients go into
  // the accumulator (sealing them) and full buckets are launched. If it
  // fails (out of memory), what it sealed stays sealed and complete (each
  // sealed gradient is the whole group's), so the retry's pieces must skip
  // the sealed parameters (Sealed()).
  void ArmFinalBackward();
  void Disarm();
  bool Sealed(size_t i) const;
  // Launches the buckets not launched yet, waits for all of them and puts
  // the sums over the ranks into the accumulator.
  void Finish();
  // Fault injection (testing.stop_in_collective_at_step): raise(SIGSTOP)
  // right after the first bucket of step `step` is launched.
  void StopInCollectiveAt(int64_t step) { stop_at_step_ = step; }

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t numel = 0;
    int64_t ready = 0;  // sealed params of this step
    at::Tensor flat;
    std::shared_ptr<Gang::Pending> pending;
    bool in_backward = false;
  };
  void OnGradient(size_t i, const at::Tensor& grad);
  void LaunchReady();
  void Launch(size_t b);

  Gang* gang_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<char> sealed_;
  std::vector<at::Tensor>* accum_ = nullptr;
  size_t next_launch_ = 0;
  bool armed_ = false;
  bool overlap_ = true;
  int64_t step_ = 0;
  int64_t stop_at_step_ = -1;
};

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_GANG_DISTRIBUTED_H_
