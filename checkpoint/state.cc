#include "checkpoint/state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trainsup::ckpt {
namespace {

// The key of a parameter in torch::optim::Optimizer::state() (its
// TensorImpl; LibTorch 1.13 keyed it by that pointer printed as a string).
void* StateKey(const at::Tensor& p) { return p.unsafeGetTensorImpl(); }

enum class OptimizerKind { kSgd, kAdamW };

absl::StatusOr<OptimizerKind> KindOf(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::SGD*>(&o) != nullptr) return OptimizerKind::kSgd;
  if (dynamic_cast<const torch::optim::AdamW*>(&o) != nullptr) return OptimizerKind::kAdamW;
  return absl::InvalidArgumentError("checkpoints support torch::optim::SGD and AdamW only");
}

const char* KindName(OptimizerKind k) { return k == OptimizerKind::kSgd ? "sgd" : "adamw"; }

NamedTensors ModelTensors(const torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& p : model.named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

// With `copy`, a malloc'd host tensor outside LibTorch's CPU allocator
// (Snapshot says why); without, `t` itself when it is a contiguous CPU
// tensor.
at::Tensor HostCopy(const at::Tensor& t, bool copy) {
  if (!copy) return t.detach().to(at::kCPU, /*non_blocking=*/false, false).contiguous();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  void* p = std::malloc(std::max<size_t>(bytes, 1));
  if (p == nullptr) throw std::bad_alloc();
  at::Tensor out = at::from_blob(
      p, t.sizes(), [](void* q) { std::free(q); }, t.options().device(at::kCPU));
  out.copy_(t.detach());
  return out;
}

std::string TrainerJson(const TrainerState& t) {
  nlohmann::json j;
  j["step"] = t.step;
  j["epoch"] = t.epoch;
  j["cursor"] = t.cursor;
  j["cpu_rng_state"] = ToHex(t.cpu_rng_state);
  j["data_rng_state"] = ToHex(t.data_rng_state);
  nlohmann::json extra = nlohmann::json::parse(t.extra_json, nullptr, false);
  j["extra"] = extra.is_discarded() ? nlohmann::json::object() : extra;
  return j.dump(2) + "\n";
}

absl::StatusOr<TrainerState> ParseTrainer(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::DataLossError("trainer.json is not a JSON object");
  TrainerState t;
  for (const char* k : {"step", "epoch", "cursor"}) {
    if (!j.contains(k) || !j[k].is_number_integer()) {
      return absl::DataLossError(absl::StrCat("trainer.json: '", k, "' missing or not an integer"));
    }
  }
  t.step = j["step"].get<int64_t>();
  t.epoch = j["epoch"].get<int64_t>();
  t.cursor = j["cursor"].get<int64_t>();
  for (auto [key, dest] : {std::pair{"cpu_rng_state", &t.cpu_rng_state},
                           std::pair{"data_rng_state", &t.data_rng_state}}) {
    if (!j.contains(key) || !j[key].is_string() || !FromHex(j[key].get<std::string>(), dest)) {
      return absl::DataLossError(absl::StrCat("trainer.json: '", key, "' missing or not hex"));
    }
  }
  t.extra_json = j.contains("extra") ? j["extra"].dump() : "{}";
  return t;
}

at::Tensor GeneratorStateNow() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

}  // namespace

std::string ToHex(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

bool FromHex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi << 4 | lo));
  }
  return true;
}

std::string CpuGeneratorState() {
  at::Tensor state = GeneratorStateNow();
  return std::string(static_cast<const char*>(state.data_ptr()), state.numel());
}

namespace {

// `bytes` as a generator state tensor, if LibTorch accepts it: it rejects
// some states (e.g. all zeros), so it is tried on a scratch generator
// before anything is applied.
absl::StatusOr<at::Tensor> CheckedGeneratorState(const std::string& bytes) {
  at::Tensor state = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  if (state.numel() != GeneratorStateNow().numel()) {
    return absl::FailedPreconditionError("the CPU generator state has the wrong size");
  }
  try {
    at::Generator scratch = at::make_generator<at::CPUGeneratorImpl>();
    scratch.set_state(state);
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("invalid CPU generator state: ", e.what_without_backtrace()));
  }
  return state;
}

}  // namespace

absl::Status SetCpuGeneratorState(const std::string& bytes) {
  absl::StatusOr<at::Tensor> checked = CheckedGeneratorState(bytes);
  if (!checked.ok()) return checked.status();
  at::Tensor state = *checked;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
  return absl::OkStatus();
}

uint64_t StateSnapshot::bytes() const {
  uint64_t n = 0;
  for (const auto* list : {&model, &optimizer}) {
    for (const auto& [name, t] : *list) n += static_cast<uint64_t>(t.numel()) * t.element_size();
  }
  return n;
}

absl::StatusOr<StateSnapshot> Snapshot(const torch::nn::Module& model,
                                       const torch::optim::Optimizer& optimizer,
                                       TrainerState trainer, bool copy) {
  auto kind = KindOf(optimizer);
  if (!kind.ok()) return kind.status();
  StateSnapshot s;
  s.step = trainer.step;
  for (const auto& [name, t] : ModelTensors(model)) s.model.emplace_back(name, HostCopy(t, copy));
  s.optimizer_metadata["optimizer"] = KindName(*kind);
  nlohmann::json groups = nlohmann::json::array();
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    groups.push_back({{"lr", group.options().get_lr()}, {"params", group.params().size()}});
    for (const auto& p : group.params()) {
      const std::string prefix = absl::StrCat("param.", index++, ".");
      auto it = optimizer.state().find(StateKey(p));
      if (it == optimizer.state().end()) continue;
      if (*kind == OptimizerKind::kSgd) {
        const auto& st = static_cast<const torch::optim::SGDParamState&>(*it->second);
        if (st.momentum_buffer().defined()) {
          s.optimizer.emplace_back(prefix + "momentum_buffer",
                                   HostCopy(st.momentum_buffer(), copy));
        }
      } else {
        const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
        s.optimizer.emplace_back(prefix + "step",
                                 at::tensor(std::vector<int64_t>{st.step()}, at::kLong));
        s.optimizer.emplace_back(prefix + "exp_avg", HostCopy(st.exp_avg(), copy));
        s.optimizer.emplace_back(prefix + "exp_avg_sq", HostCopy(st.exp_avg_sq(), copy));
        if (st.max_exp_avg_sq().defined()) {
          s.optimizer.emplace_back(prefix + "max_exp_avg_sq", HostCopy(st.max_exp_avg_sq(), copy));
        }
      }
    }
  }
  s.optimizer_metadata["param_groups"] = groups.dump();
  at::Tensor rng = GeneratorStateNow();
  trainer.cpu_rng_state.assign(static_cast<const char*>(rng.data_ptr()), rng.numel());
  s.trainer = std::move(trainer);
  return s;
}

absl::Status SaveState(CheckpointStore& store, const torch::nn::Module& model,
                       const torch::optim::Optimizer& optimizer, TrainerState trainer) {
  auto snapshot = Snapshot(model, optimizer, std::move(trainer), /*copy=*/false);
  if (!snapshot.ok()) return snapshot.status();
  return WriteSnapshot(store, *snapshot);
}

namespace {

// Non-finite elements of `t`, reading it in place: a save under a tight
// memory budget must not allocate a mask the size of its largest tensor.
template <typename T>
int64_t NonFiniteIn(const at::Tensor& t) {
  const T* p = t.data_ptr<T>();
  int64_t bad = 0;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) bad += !std::isfinite(static_cast<double>(p[i]));
  return bad;
}

// Allocates nothing for a contiguous CPU tensor: a background write
// (AsyncCheckpointer) runs this beside a training step whose memory
// budget counts LibTorch's CPU allocations.

int64_t NonFinite(const at::Tensor& tensor) {
  const at::Tensor t =
      tensor.is_contiguous() && tensor.is_cpu() ? tensor : tensor.contiguous().cpu();
  if (t.scalar_type() == at::kFloat) return NonFiniteIn<float>(t);
  if (t.scalar_type() == at::kDouble) return NonFiniteIn<double>(t);
  if (t.scalar_type() == at::kHalf) return NonFiniteIn<c10::Half>(t);
  if (t.scalar_type() == at::kBFloat16) return NonFiniteIn<c10::BFloat16>(t);
  return t.numel() - at::isfinite(t).sum().item<int64_t>();  // other floating types
}

}  // namespace

absl::Status CheckFinite(const StateSnapshot& snapshot) {
  for (const auto* list : {&snapshot.model, &snapshot.optimizer}) {
    for (const auto& [name, t] : *list) {
      if (!t.is_floating_point()) continue;
      const int64_t bad = NonFinite(t);
      if (bad > 0) {
        return absl::FailedPreconditionError(
            absl::StrCat(list == &snapshot.model ? "model tensor " : "optimizer tensor ", name,
                         " has ", bad, " non-finite value", bad == 1 ? "" : "s", " of ", t.numel(),
                         "; a checkpoint never holds one"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteSnapshot(CheckpointStore& store, const StateSnapshot& snapshot) {
  // Refused before anything is written: no half-made checkpoint.
  if (absl::Status finite = CheckFinite(snapshot); !finite.ok()) return finite;
  auto pending = store.Begin(snapshot.step);
  if (!pending.ok()) return pending.status();
  absl::Status s = (*pending)->WriteFile(kModelFile, [&](const ByteSink& sink) {
    return WriteSafetensors(snapshot.model, {{"format", "pt"}}, sink);
  });
  if (s.ok()) {
    s = (*pending)->WriteFile(kOptimizerFile, [&](const ByteSink& sink) {
      return WriteSafetensors(snapshot.optimizer, snapshot.optimizer_metadata, sink);
    });
  }
  if (s.ok()) s = (*pending)->WriteFile(kTrainerFile, TrainerJson(snapshot.trainer));
  if (!s.ok()) {
    store.Abort(std::move(*pending));
    return s;
  }
  return store.Commit(std::move(*pending));
}

namespace {

// Every tensor the model needs is in the checkpoint with its shape and
// type, and the checkpoint has no other.
absl::Status CheckModelTensors(const NamedTensors& targets, const SafetensorsFile& weights) {
  std::set<std::string> expected;
  for (const auto& [name, t] : targets) {
    expected.insert(name);
    auto it = weights.tensors.find(name);
    if (it == weights.tensors.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint has no tensor '", name, "' that the model needs"));
    }
    if (it->second.sizes() != t.sizes() || it->second.scalar_type() != t.scalar_type()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", name, "': checkpoint has ",
                       c10::toString(it->second.scalar_type()), " ", c10::str(it->second.sizes()),
                       ", the model ", c10::toString(t.scalar_type()), " ", c10::str(t.sizes())));
    }
  }
  for (const auto& [name, t] : weights.tensors) {
    if (!expected.count(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint tensor '", name, "' is not in the model"));
    }
  }
  return absl::OkStatus();
}

// The checkpoint's optimizer is the trainer's, with the same groups of the
// same sizes: its groups' metadata, and the parameters in order.
absl::Status MatchOptimizer(SafetensorsFile& opt, OptimizerKind kind,
                            torch::optim::Optimizer& optimizer, nlohmann::json* groups,
                            std::vector<at::Tensor>* params) {
  auto kind_it = opt.metadata.find("optimizer");
  if (kind_it == opt.metadata.end() || kind_it->second != KindName(kind)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint optimizer is '", kind_it == opt.metadata.end() ? "unknown" : kind_it->second,
        "', the trainer's is '", KindName(kind), "'"));
  }
  *groups = nlohmann::json::parse(opt.metadata["param_groups"], nullptr, false);
  if (groups->is_discarded() || !groups->is_array() ||
      groups->size() != optimizer.param_groups().size()) {
    return absl::FailedPreconditionError(
        "checkpoint optimizer has a different number of parameter groups");
  }
  for (size_t g = 0; g < groups->size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    const nlohmann::json& saved = (*groups)[g];
    if (!saved.is_object() || !saved.contains("params") || !saved["params"].is_number_unsigned() ||
        saved["params"].get<size_t>() != group.params().size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("optimizer group ", g, " has another parameter count"));
    }
    for (const auto& p : group.params()) params->push_back(p);
  }
  return absl::OkStatus();
}

// One parameter's optimizer state as read (SGD: a = momentum; AdamW: step,
// a = exp_avg, b = exp_avg_sq, c = max_exp_avg_sq).
struct LoadedState {
  at::Tensor a, b, c;
  int64_t step = -1;
};

// Each parameter's optimizer state from the checkpoint, checked against the
// parameter; a tensor that matches no parameter is an error.
absl::Status ReadOptimizerState(const SafetensorsFile& opt, OptimizerKind kind,
                                const std::vector<at::Tensor>& params,
                                std::vector<LoadedState>* loaded) {
  std::set<std::string> used;
  auto state_tensor = [&](int64_t i, const char* field, const at::Tensor& like,
                          at::Tensor* out) -> absl::Status {
    const std::string key = absl::StrCat("param.", i, ".", field);
    auto it = opt.tensors.find(key);
    if (it == opt.tensors.end()) {
      *out = at::Tensor();
      return absl::OkStatus();
    }
    used.insert(key);
    if (like.defined() &&
        (it->second.sizes() != like.sizes() || it->second.scalar_type() != like.scalar_type())) {
      return absl::FailedPreconditionError(
          absl::StrCat("optimizer tensor '", key, "' has shape ", c10::str(it->second.sizes()),
                       ", the parameter ", c10::str(like.sizes())));
    }
    *out = it->second;
    return absl::OkStatus();
  };
  loaded->assign(params.size(), LoadedState());
  for (size_t i = 0; i < params.size(); ++i) {
    LoadedState& l = (*loaded)[i];
    absl::Status s;
    if (kind == OptimizerKind::kSgd) {
      s = state_tensor(i, "momentum_buffer", params[i], &l.a);
    } else {
      at::Tensor step;
      s = state_tensor(i, "step", at::Tensor(), &step);
      if (s.ok() && step.defined()) {
        if (step.numel() != 1 || step.scalar_type() != at::kLong) {
          return absl::FailedPreconditionError(
              absl::StrCat("optimizer tensor 'param.", i, ".step' is not one int64"));
        }
        l.step = step.item<int64_t>();
        s = state_tensor(i, "exp_avg", params[i], &l.a);
        if (s.ok()) s = state_tensor(i, "exp_avg_sq", params[i], &l.b);
        if (s.ok()) s = state_tensor(i, "max_exp_avg_sq", params[i], &l.c);
        if (s.ok() && (!l.a.defined() || !l.b.defined())) {
          return absl::FailedPreconditionError(
              absl::StrCat("optimizer state of parameter ", i, " is incomplete"));
        }
      }
    }
    if (!s.ok()) return s;
  }
  for (const auto& [name, t] : opt.tensors) {
    if (!used.count(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint optimizer tensor '", name, "' matches no parameter"));
    }
  }
  return absl::OkStatus();
}

// The checked optimizer state into the optimizer, and the groups' learning
// rates.
void ApplyOptimizerState(OptimizerKind kind, const std::vector<at::Tensor>& params,
                         const std::vector<LoadedState>& loaded, const nlohmann::json& groups,
                         torch::optim::Optimizer& optimizer) {
  optimizer.state().clear();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (kind == OptimizerKind::kSgd) {
      if (!loaded[i].a.defined()) continue;
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(loaded[i].a.to(p.device()));
      optimizer.state()[StateKey(p)] = std::move(st);
    } else {
      if (loaded[i].step < 0) continue;
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(loaded[i].step);
      st->exp_avg(loaded[i].a.to(p.device()));
      st->exp_avg_sq(loaded[i].b.to(p.device()));
      if (loaded[i].c.defined()) st->max_exp_avg_sq(loaded[i].c.to(p.device()));
      optimizer.state()[StateKey(p)] = std::move(st);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].contains("lr") && groups[g]["lr"].is_number()) {
      optimizer.param_groups()[g].options().set_lr(groups[g]["lr"].get<double>());
    }
  }
}

}  // namespace

absl::Status LoadState(CheckpointStore& store, const CheckpointInfo& checkpoint,
                       torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                       TrainerState* trainer) {
  auto kind = KindOf(optimizer);
  if (!kind.ok()) return kind.status();
  FileSystem* fs = store.fs();
  auto weights = ReadSafetensors(fs, JoinPath(checkpoint.path, kModelFile));
  if (!weights.ok()) return weights.status();
  auto opt = ReadSafetensors(fs, JoinPath(checkpoint.path, kOptimizerFile));
  if (!opt.ok()) return opt.status();
  const std::string trainer_path = JoinPath(checkpoint.path, kTrainerFile);
  auto trainer_text = fs->ReadSmallFile(trainer_path);
  if (!trainer_text.ok()) {
    return CheckpointReadError(trainer_text.status(),
                               absl::StrCat(trainer_path, ": ", trainer_text.status().message()));
  }
  auto parsed_trainer = ParseTrainer(*trainer_text);
  if (!parsed_trainer.ok()) return parsed_trainer.status();

  // Check everything before changing anything.
  const NamedTensors targets = ModelTensors(model);
  if (absl::Status s = CheckModelTensors(targets, *weights); !s.ok()) return s;
  nlohmann::json groups;
  std::vector<at::Tensor> params;
  if (absl::Status s = MatchOptimizer(*opt, *kind, optimizer, &groups, &params); !s.ok()) return s;
  std::vector<LoadedState> loaded;
  if (absl::Status s = ReadOptimizerState(*opt, *kind, params, &loaded); !s.ok()) return s;
  absl::StatusOr<at::Tensor> checked_rng = CheckedGeneratorState(parsed_trainer->cpu_rng_state);
  if (!checked_rng.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer.json: ", checked_rng.status().message()));
  }
  at::Tensor rng = *checked_rng;

  // Apply.
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : targets)
      const_cast<at::Tensor&>(t).copy_(weights->tensors.at(name));
  }
  ApplyOptimizerState(*kind, params, loaded, groups, optimizer);
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  if (trainer != nullptr) *trainer = *parsed_trainer;
  return absl::OkStatus();
}

AsyncCheckpointer::AsyncCheckpointer(CheckpointStore* store, std::function<void()> before_write)
    : store_(store), before_write_(std::move(before_write)), thread_([this] { Run(); }) {}

AsyncCheckpointer::~AsyncCheckpointer() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::optional<WriteResult> AsyncCheckpointer::Save(StateSnapshot snapshot) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  std::optional<WriteResult> previous = std::move(finished_);
  finished_.reset();
  next_ = std::make_unique<StateSnapshot>(std::move(snapshot));
  busy_ = true;
  cv_.notify_all();
  return previous;
}

std::optional<WriteResult> AsyncCheckpointer::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<WriteResult> r = std::move(finished_);
  finished_.reset();
  return r;
}

std::optional<WriteResult> AsyncCheckpointer::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  std::optional<WriteResult> r = std::move(finished_);
  finished_.reset();
  return r;
}

bool AsyncCheckpointer::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void AsyncCheckpointer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || next_ != nullptr; });
    if (next_ == nullptr) return;
    std::unique_ptr<StateSnapshot> job = std::move(next_);
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    WriteResult result;
    result.step = job->step;
    try {
      if (before_write_) before_write_();
      result.status = WriteSnapshot(*store_, *job);
    } catch (const std::exception& e) {
      result.status = absl::InternalError(absl::StrCat("checkpoint writer: ", e.what()));
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    job.reset();
    lock.lock();
    finished_ = std::move(result);
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace trainsup::ckpt
