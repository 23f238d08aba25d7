#include "worker/gang/distributed.h"

// ProcessGroupGloo.hpp declares its class only under USE_C10D_GLOO, the
// macro LibTorch's own build sets; the wheel's LibTorch is built with Gloo
// (libtorch_cpu exports ProcessGroupGloo). Gloo's own headers, which
// ProcessGroupGloo.hpp includes, come from Debian's libgloo-dev: the wheel
// ships none. Only declarations are used (ProcessGroupGloo's API holds Gloo
// types by shared_ptr alone); libgloo itself is never linked, so the code
// that runs is the wheel's (docs/building.md, "Link hazards").
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif

#include <signal.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef TRAINSUP_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainsup::worker {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string EnteredKey(int rank) { return absl::StrCat("trainsup/entered/", rank); }

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// Sets an environment variable unless the user did.
void DefaultEnv(const char* name, const char* value) { setenv(name, value, /*overwrite=*/0); }

// The backend a gang of `o` runs on, "gloo" or "nccl" ("auto": NCCL for a
// CUDA device where this build has it); InvalidArgument for one that is
// unknown, missing from this build, or NCCL without a CUDA device.
absl::StatusOr<std::string> ChooseBackend(const GangOptions& o) {
  std::string backend = o.backend;
  if (backend == "auto") {
#ifdef TRAINSUP_HAVE_NCCL
    backend = o.device.is_cuda() ? "nccl" : "gloo";
#else
    backend = "gloo";
#endif
  }
  if (backend == "nccl") {
#ifndef TRAINSUP_HAVE_NCCL
    return absl::InvalidArgumentError(
        "distributed.backend: \"nccl\", but this worker's LibTorch has no NCCL (use gloo or auto)");
#else
    if (!o.device.is_cuda()) {
      return absl::InvalidArgumentError(
          "distributed.backend: \"nccl\" needs train.device on CUDA; this worker trains on the "
          "CPU");
    }
#endif
  } else if (backend != "gloo") {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed.backend: must be auto, gloo or nccl; got \"", backend, "\""));
  }
  return backend;
}

// A Gloo process group of the gang `o` on `store` under key prefix
// `prefix`, bound to the device(s) ChooseGlooDevice picks. Throws
// std::runtime_error naming the interface or address Gloo cannot bind to.
c10::intrusive_ptr<c10d::Backend> MakeGlooGroup(const GangOptions& o,
                                                const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::string& prefix) {
  auto go = c10d::ProcessGroupGloo::Options::create(Millis(o.timeout_s));
  // Loopback for a single machine; otherwise the interface this host's
  // name resolves to (GLOO_SOCKET_IFNAME-style selection is issue 13's).
  const GlooDeviceChoice choice = ChooseGlooDevice(o.master_addr, o.node_addr, o.gloo_ifname);
  for (const std::string& name : choice.names) {
    try {
      go->devices.push_back(choice.kind == GlooDeviceChoice::Kind::kInterfaces
                                ? c10d::ProcessGroupGloo::createDeviceForInterface(name)
                                : c10d::ProcessGroupGloo::createDeviceForHostname(name));
    } catch (const std::exception& e) {
      throw std::runtime_error(
          absl::StrCat(choice.kind == GlooDeviceChoice::Kind::kInterfaces
                           ? "GLOO_SOCKET_IFNAME: cannot bind Gloo to interface \""
                           : "TRAINSUP_NODE_ADDR: cannot bind Gloo to address \"",
                       name, "\": ", e.what()));
    }
  }
  if (choice.names.empty()) {
    go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  go->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>(prefix, store), o.rank, o.world_size, go);
}

}  // namespace

GlooDeviceChoice ChooseGlooDevice(const std::string& master_addr, const std::string& node_addr,
                                  const std::string& gloo_ifname) {
  GlooDeviceChoice c;
  for (absl::string_view name : absl::StrSplit(gloo_ifname, ',', absl::SkipWhitespace())) {
    c.names.emplace_back(absl::StripAsciiWhitespace(name));
  }
  if (!c.names.empty()) {
    c.kind = GlooDeviceChoice::Kind::kInterfaces;
  } else if (IsLoopback(master_addr)) {
    c.kind = GlooDeviceChoice::Kind::kAddress;
    c.names = {"127.0.0.1"};
  } else if (!node_addr.empty()) {
    c.kind = GlooDeviceChoice::Kind::kAddress;
    c.names = {node_addr};
  }
  return c;
}

GroupKind GroupFor(bool separate_host_group, const c10::Device& tensor_device) {
  return separate_host_group && !tensor_device.is_cuda() ? GroupKind::kHost : GroupKind::kDevice;
}

struct Gang::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  // Collectives on the training device's tensors, and on host tensors
  // where the device's backend cannot take them (NCCL): one group, the
  // same object twice, with Gloo alone.
  c10::intrusive_ptr<c10d::Backend> device_group;
  c10::intrusive_ptr<c10d::Backend> host_group;

  bool separate() const { return host_group.get() != device_group.get(); }
  c10d::Backend& For(const at::Tensor& t) {
    return GroupFor(separate(), t.device()) == GroupKind::kHost ? *host_group : *device_group;
  }
};

class Gang::Pending {
 public:
  c10::intrusive_ptr<c10d::Work> work;
  int64_t seq = 0;
  std::string what;
  Clock::time_point launched;
  // When the backend finished it (steady clock nanoseconds; 0: not yet).
  std::shared_ptr<std::atomic<int64_t>> done_ns = std::make_shared<std::atomic<int64_t>>(0);
  bool waited = false;
};

Gang::Gang(GangOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

Gang::~Gang() = default;

absl::StatusOr<std::unique_ptr<Gang>> Gang::Join(const GangOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is outside a world of ", o.world_size));
  }
  std::unique_ptr<Gang> gang(new Gang(o));
  if (o.world_size == 1) return gang;
  if (o.master_port < 1 || o.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT: a port in [1, 65535] is needed for a world of ", o.world_size,
                     ", got ", o.master_port));
  }
  if (o.master_addr.empty()) {
    return absl::InvalidArgumentError("MASTER_ADDR: empty (rank 0's address is needed)");
  }
  absl::StatusOr<std::string> chosen = ChooseBackend(o);
  if (!chosen.ok()) return chosen.status();
  const std::string backend = *chosen;
  gang->backend_ = backend;
  const std::string where =
      absl::StrCat(o.master_addr, ":", o.master_port, " as rank ", o.rank, " of ", o.world_size);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.rank == 0;
    so.numWorkers = static_cast<size_t>(o.world_size);
    so.waitWorkers = true;
    so.timeout = Millis(o.connect_timeout_s);
    gang->impl_->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    if (backend == "gloo" && !o.host_group_beside_device) {
      gang->impl_->device_group = MakeGlooGroup(o, gang->impl_->store, "gloo");
      gang->impl_->host_group = gang->impl_->device_group;
    } else if (backend == "gloo") {
      // The layout of an NCCL gang, with Gloo in the device's place: what
      // the tests run where there is no GPU.
      gang->impl_->device_group = MakeGlooGroup(o, gang->impl_->store, "device");
      gang->impl_->host_group = MakeGlooGroup(o, gang->impl_->store, "host");
    } else {
#ifdef TRAINSUP_HAVE_NCCL
      // Compiled and linked in every build; never run (no GPU has run it).
      // A collective that outlasts distributed.timeout_s must end this rank
      // with a CollectiveError (exit 76), not hang: Wait() passes the
      // timeout to Work::wait, and on a timeout the watchdog aborts the
      // communicator without killing the process (CleanUpOnly).
      DefaultEnv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2");
      DefaultEnv("TORCH_NCCL_BLOCKING_WAIT", "1");
      auto no = c10d::ProcessGroupNCCL::Options::create();
      no->timeout = Millis(o.timeout_s);
      gang->impl_->device_group = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("nccl", gang->impl_->store), o.rank, o.world_size,
          no);
      // The control tensor, the loss sums, AllGather and the checkpoint
      // result are host tensors, which ProcessGroupNCCL rejects.
      gang->impl_->host_group = MakeGlooGroup(o, gang->impl_->store, "host");
#endif
    }
    // Store calls after the join (the entered-collective records and the
    // diagnosis of a failure) must not outwait the collectives' timeout.
    gang->impl_->store->setTimeout(Millis(std::min(o.timeout_s, 10.0)));
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(absl::StrCat(
        "joining the gang at ", where, " (", backend,
        ") failed within distributed.connect_timeout_s = ", o.connect_timeout_s, " s: ", e.what()));
  }
  return gang;
}

int64_t Gang::Enter(const std::string& what) {
  const int64_t seq = ++seq_;
  ++stats_.collectives;
  if (options_.world_size > 1) {
    try {
      impl_->store->set(EnteredKey(options_.rank), Bytes(absl::StrCat(seq, "\t", what)));
    } catch (const std::exception& e) {
      Fail(seq, what, absl::StrCat("the rendezvous store on rank 0 did not answer: ", e.what()));
    }
  }
  return seq;
}

void Gang::Fail(int64_t seq, const std::string& what, const std::string& cause) {
  // Where every peer is, as far as the store knows. The store lives in rank
  // 0: if it does not answer, rank 0 is gone (or stopped).
  std::string peers;
  for (int p = 0; p < options_.world_size; ++p) {
    if (p == options_.rank) continue;
    std::string line;
    try {
      if (!impl_->store->check({EnteredKey(p)})) {
        line = absl::StrCat("rank ", p, " never entered a collective");
      } else {
        std::vector<uint8_t> v = impl_->store->get(EnteredKey(p));
        std::string text(v.begin(), v.end());
        std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits('\t', 1));
        int64_t their = 0;
        absl::SimpleAtoi(parts[0], &their);
        const std::string their_what = parts.size() > 1 ? parts[1] : "";
        if (their < seq) {
          line = absl::StrCat("rank ", p, " is behind (its last collective: #", their, " ",
                              their_what, ")");
        } else if (their == seq) {
          line = absl::StrCat("rank ", p, " entered it and stopped answering (dead or stopped)");
        } else {
          line = absl::StrCat("rank ", p, " is ahead (#", their, " ", their_what, ")");
        }
      }
    } catch (const std::exception&) {
      line = p == 0 ? "rank 0 (the store's host) does not answer: dead or stopped"
                    : absl::StrCat("rank ", p, ": unknown (the store does not answer)");
      if (!peers.empty()) absl::StrAppend(&peers, "; ");
      absl::StrAppend(&peers, line);
      break;
    }
    if (!peers.empty()) absl::StrAppend(&peers, "; ");
    absl::StrAppend(&peers, line);
  }
  throw CollectiveError(absl::StrCat("collective #", seq, " (", what, ") failed on rank ",
                                     options_.rank, " of ", options_.world_size, ": ", peers, ". ",
                                     backend_, ": ", cause));
}

void Gang::AllreduceSum(at::Tensor& tensor, const std::string& what) {
  if (options_.world_size == 1) return;
  const int64_t seq = Enter(what);
  const auto t0 = Clock::now();
  try {
    std::vector<at::Tensor> list{tensor};
    CountGroup(tensor);
    impl_->For(tensor).allreduce(list)->wait(Millis(options_.timeout_s));
  } catch (const std::exception& e) {
    Fail(seq, what, e.what());
  }
  stats_.blocked_s += Since(t0);
  stats_.bytes += static_cast<int64_t>(tensor.nbytes());
}

void Gang::Broadcast(at::Tensor& tensor, int root, const std::string& what, double timeout_s) {
  if (options_.world_size == 1) return;
  const int64_t seq = Enter(what);
  const auto t0 = Clock::now();
  try {
    std::vector<at::Tensor> list{tensor};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    const std::chrono::milliseconds timeout =
        Millis(timeout_s > 0 ? timeout_s : options_.timeout_s);
    bo.timeout = timeout;  // Gloo's receive waits this long, not the group's timeout
    CountGroup(tensor);
    impl_->For(tensor).broadcast(list, bo)->wait(timeout);
  } catch (const std::exception& e) {
    Fail(seq, what, e.what());
  }
  stats_.blocked_s += Since(t0);
  stats_.bytes += static_cast<int64_t>(tensor.nbytes());
}

void Gang::Barrier(const std::string& what) {
  if (options_.world_size == 1) return;
  const int64_t seq = Enter(what);
  const auto t0 = Clock::now();
  try {
    // A barrier on the host group: every rank's training thread meets
    // there, whatever queues the device holds.
    if (impl_->separate()) ++stats_.host_collectives;
    impl_->host_group->barrier()->wait(Millis(options_.timeout_s));
  } catch (const std::exception& e) {
    Fail(seq, what, e.what());
  }
  stats_.blocked_s += Since(t0);
}

std::vector<std::string> Gang::AllGather(const std::string& mine, const std::string& what) {
  if (options_.world_size == 1) return {mine};
  const int w = options_.world_size;
  // Gloo gathers equal sizes: the lengths first, then every string padded
  // to the longest.
  at::Tensor length = at::zeros({w}, at::kLong);
  length[options_.rank] = static_cast<int64_t>(mine.size());
  AllreduceSum(length, absl::StrCat(what, ": lengths"));
  const int64_t longest = length.max().item<int64_t>();
  at::Tensor bytes = at::zeros({w, std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(bytes[options_.rank].data_ptr<uint8_t>(), mine.data(), mine.size());
  // A sum of rows that are zero everywhere but in their own rank's row.
  // Bytes do not overflow: each position has one non-zero contribution.
  AllreduceSum(bytes, what);
  std::vector<std::string> all(w);
  for (int r = 0; r < w; ++r) {
    const uint8_t* row = bytes[r].data_ptr<uint8_t>();
    all[r].assign(reinterpret_cast<const char*>(row),
                  static_cast<size_t>(length[r].item<int64_t>()));
  }
  return all;
}

std::shared_ptr<Gang::Pending> Gang::AllreduceAsync(at::Tensor tensor, const std::string& what) {
  auto p = std::make_shared<Pending>();
  p->what = what;
  if (options_.world_size == 1) return p;
  p->seq = Enter(what);
  p->launched = Clock::now();
  try {
    std::vector<at::Tensor> list{tensor};
    CountGroup(tensor);
    p->work = impl_->For(tensor).allreduce(list);
    std::shared_ptr<std::atomic<int64_t>> done = p->done_ns;
    p->work->getFuture()->addCallback([done](c10::ivalue::Future&) {
      done->store(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
              .count());
    });
  } catch (const std::exception& e) {
    Fail(p->seq, what, e.what());
  }
  stats_.bytes += static_cast<int64_t>(tensor.nbytes());
  return p;
}

double Gang::Wait(Pending& p) {
  if (options_.world_size == 1 || p.waited) return 0;
  p.waited = true;
  const auto t0 = Clock::now();
  try {
    p.work->wait(Millis(options_.timeout_s));
  } catch (const std::exception& e) {
    Fail(p.seq, p.what, e.what());
  }
  stats_.blocked_s += Since(t0);
  const int64_t done = p.done_ns->load();
  const auto end = done > 0 ? Clock::time_point(std::chrono::nanoseconds(done)) : Clock::now();
  return std::chrono::duration<double>(end - p.launched).count();
}

void Gang::CountGroup(const at::Tensor& tensor) {
  if (GroupFor(impl_->separate(), tensor.device()) == GroupKind::kHost) ++stats_.host_collectives;
}

CollectiveStats Gang::TakeStats() {
  CollectiveStats s = stats_;
  stats_ = CollectiveStats();
  return s;
}

// --- GradientReducer --------------------------------------------------------------------

GradientReducer::GradientReducer(Gang* gang, std::vector<at::Tensor> params, int64_t bucket_bytes,
                                 bool overlap)
    : gang_(gang), params_(std::move(params)), overlap_(overlap) {
  sealed_.assign(params_.size(), 0);
  bucket_of_.assign(params_.size(), 0);
  if (gang_ == nullptr || gang_->world_size() == 1) return;
  // Reverse order: backward makes the last layers' gradients first.
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    if (buckets_.empty() || bytes >= bucket_bytes) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    b.numel += params_[k].numel();
    bytes += static_cast<int64_t>(params_[k].nbytes());
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (Bucket& b : buckets_) b.flat = at::empty({b.numel}, params_.front().options());
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].register_hook([this, i](const at::Tensor& grad) { OnGradient(i, grad); });
  }
}

GradientReducer::~GradientReducer() {
  // The hooks hold `this`; the parameters die with the model, which the
  // trainer keeps no longer than the reducer (hooks cannot be removed from
  // a leaf in LibTorch 1.13 without its index, so they are disarmed).
  armed_ = false;
  accum_ = nullptr;
}

void GradientReducer::BeginStep(std::vector<at::Tensor>* accum, int64_t step) {
  accum_ = accum;
  step_ = step;
  next_launch_ = 0;
  armed_ = false;
  std::fill(sealed_.begin(), sealed_.end(), 0);
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.pending.reset();
    b.in_backward = false;
  }
}

void GradientReducer::ArmFinalBackward() {
  if (overlap_ && !buckets_.empty() && accum_ != nullptr) armed_ = true;
}

void GradientReducer::Disarm() { armed_ = false; }

bool GradientReducer::Sealed(size_t i) const { return i < sealed_.size() && sealed_[i] != 0; }

void GradientReducer::OnGradient(size_t i, const at::Tensor& grad) {
  if (!armed_ || sealed_[i] || !grad.defined()) return;
  at::NoGradGuard no_grad;
  (*accum_)[i].add_(grad);
  sealed_[i] = 1;
  buckets_[bucket_of_[i]].ready++;
  LaunchReady();
}

void GradientReducer::LaunchReady() {
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_].ready ==
             static_cast<int64_t>(buckets_[next_launch_].params.size())) {
    Launch(next_launch_++);
  }
}

void GradientReducer::Launch(size_t b) {
  Bucket& bucket = buckets_[b];
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (size_t k : bucket.params) {
    const at::Tensor& a = (*accum_)[k];
    bucket.flat.narrow(0, offset, a.numel()).copy_(a.reshape({-1}));
    offset += a.numel();
  }
  bucket.in_backward = armed_;
  bucket.pending = gang_->AllreduceAsync(
      bucket.flat,
      absl::StrCat("gradient bucket ", b + 1, "/", buckets_.size(), " of step ", step_ + 1));
  if (stop_at_step_ == step_ + 1 && b == 0) {
    stop_at_step_ = -1;
    std::fprintf(stderr, "injected SIGSTOP inside the gradient allreduce of step %lld\n",
                 static_cast<long long>(step_ + 1));
    std::fflush(stderr);
    raise(SIGSTOP);
  }
}

void GradientReducer::Finish() {
  if (buckets_.empty() || accum_ == nullptr) return;
  armed_ = false;
  for (; next_launch_ < buckets_.size(); ++next_launch_) Launch(next_launch_);
  CollectiveStats& stats = gang_->stats();
  at::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    stats.bucket_flight_s += gang_->Wait(*bucket.pending);
    (bucket.in_backward ? stats.buckets_in_backward : stats.buckets_after_backward)++;
    int64_t offset = 0;
    for (size_t k : bucket.params) {
      at::Tensor& a = (*accum_)[k];
      a.copy_(bucket.flat.narrow(0, offset, a.numel()).view(a.sizes()));
      offset += a.numel();
    }
    bucket.pending.reset();
  }
}

}  // namespace trainsup::worker
