// Where a step's time goes, per op kind, for the benchmark programs: the
// wall time of every top-level RecordFunction event on one thread (ATen
// ops such as aten::add, autograd nodes such as ReluBackward0, and the
// engine's own user scopes: "conv 3x3x3", "batch norm backward", "kernel
// map", ...), summed by name. Events nested in a counted one are part of
// it. The autograd engine's wrappers (evaluate_function, and the CppNode of
// a custom function, whose body opens the engine's scope) are transparent,
// so a custom function's backward counts under its own scope name. A scope
// whose first input is a double (the engine's convolutions: their
// floating-point operations) also sums those.
#ifndef TRAINSUP_SPARSE_BENCH_OP_PROFILE_H_
#define TRAINSUP_SPARSE_BENCH_OP_PROFILE_H_

#include <ATen/record_function.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace trainsup::bench {

// One at a time per process: construction installs a global callback,
// destruction removes it. Records the constructing thread's events (the
// autograd engine runs a CPU backward on the thread that calls it), or,
// with `all_threads`, every thread's: on CUDA the engine runs the backward
// on its device thread while the caller waits, so the two never overlap.
// (Only for CUDA: on the CPU, intra-op pool threads' events would be
// counted beside the op that spawned them.)
class OpProfile {
 public:
  explicit OpProfile(bool all_threads = false) {
    State& s = GetState();
    std::lock_guard<std::mutex> lock(s.mu);
    s.owner = std::this_thread::get_id();
    s.all_threads = all_threads;
    s.seconds.clear();
    s.flops.clear();
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&Start, &End).needsInputs(true).needsIds(false));
  }
  ~OpProfile() { at::removeCallback(handle_); }
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Seconds per event name since construction or the previous Take().
  std::map<std::string, double> Take() {
    State& s = GetState();
    std::lock_guard<std::mutex> lock(s.mu);
    std::map<std::string, double> out;
    out.swap(s.seconds);
    return out;
  }
  // Floating-point operations per event name that carries them, since
  // construction or the previous TakeFlops().
  std::map<std::string, double> TakeFlops() {
    State& s = GetState();
    std::lock_guard<std::mutex> lock(s.mu);
    std::map<std::string, double> out;
    out.swap(s.flops);
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct State {
    std::mutex mu;
    std::thread::id owner;
    bool all_threads = false;
    std::map<std::string, double> seconds;
    std::map<std::string, double> flops;
  };
  struct Context : at::ObserverContext {
    bool counted = false;
    bool nests = false;  // raised the depth
    Clock::time_point start;
    double flops = -1;  // the scope's first input, when a double
  };
  static State& GetState() {
    static State* state = new State();
    return *state;
  }
  static int& Depth() {
    thread_local int depth = 0;
    return depth;
  }
  static bool Transparent(const std::string& name) {
    return name.rfind("autograd::engine::evaluate_function", 0) == 0 ||
           name.find("CppNode") != std::string::npos;
  }
  static std::unique_ptr<at::ObserverContext> Start(const at::RecordFunction& fn) {
    const State& s = GetState();
    if (!s.all_threads && std::this_thread::get_id() != s.owner) return nullptr;
    auto ctx = std::make_unique<Context>();
    if (Transparent(fn.name())) return ctx;
    ctx->counted = Depth() == 0;
    ctx->nests = true;
    // Inputs are valid only here: RecordFunction keeps a view of them.
    const auto inputs = fn.inputs();
    if (ctx->counted && !inputs.empty() && inputs[0].isDouble()) ctx->flops = inputs[0].toDouble();
    ++Depth();
    ctx->start = Clock::now();
    return ctx;
  }
  static void End(const at::RecordFunction& fn, at::ObserverContext* base) {
    auto* ctx = static_cast<Context*>(base);
    if (ctx == nullptr) return;
    if (ctx->nests) --Depth();
    if (!ctx->counted) return;
    const double dt = std::chrono::duration<double>(Clock::now() - ctx->start).count();
    State& s = GetState();
    std::lock_guard<std::mutex> lock(s.mu);
    s.seconds[fn.name()] += dt;
    if (ctx->flops >= 0) s.flops[fn.name()] += ctx->flops;
  }

  at::CallbackHandle handle_;
};

}  // namespace trainsup::bench

#endif  // TRAINSUP_SPARSE_BENCH_OP_PROFILE_H_
