#include "supervisor/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace trainsup::supervisor {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Labels;

// The RunState and SlotState names of proto/trainsup/v1/supervisor.proto,
// without their prefixes.
const char* const kRunStates[] = {"PENDING",   "STARTING", "RUNNING",  "RESTARTING",
                                  "SUCCEEDED", "FAILED",   "CANCELLED"};
const char* const kSlotStates[] = {"FREE", "BUSY", "RELEASING", "STRANDED", "DRAINED"};
constexpr char kStranded[] = "STRANDED";
constexpr char kDrained[] = "DRAINED";
const char* const kMemoryKinds[] = {"current", "peak", "budget"};

Family<Gauge>& NewGauge(prometheus::Registry& registry, const std::string& name,
                        const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

Family<Counter>& NewCounter(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

// Family::Add returns the existing series for known labels, so Has guards
// against creating one only to remove it.
template <typename T>
void RemoveSeries(Family<T>& family, const Labels& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}

// Whether `address` ("host:port") names a loopback host; InvalidArgument
// when it is not of a form the endpoint accepts.
absl::StatusOr<bool> IsLoopbackAddress(const std::string& address) {
  const auto invalid = [&address](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", address, "\": ", why));
  };
  const std::string::size_type colon = address.rfind(':');
  if (colon == std::string::npos) return invalid("expected host:port");
  const std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  int port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return invalid("the port must be a number in 0..65535");
  }
  if (host == "localhost") return true;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    in6_addr v6{};
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) != 1) {
      return invalid("not an IPv6 address inside the brackets");
    }
    return static_cast<bool>(IN6_IS_ADDR_LOOPBACK(&v6));
  }
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  // A host name other than localhost counts as remote even if it resolves
  // to a loopback address (Debian maps the machine's name to 127.0.1.1):
  // what it resolves to can change after the check.
  if (host.empty() ||
      host.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != std::string::npos) {
    return invalid("the host must be an IPv4 address, [IPv6 address] or host name");
  }
  return false;
}

}  // namespace

struct Metrics::Impl {
  // Declared before the exposer so that the exposer (and its threads, which
  // read the registry) is destroyed first.
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();

  Family<Gauge>& runs = NewGauge(*registry, "trainsup_runs", "Runs in each state.");
  Family<Counter>& restarts = NewCounter(*registry, "trainsup_restarts_total",
                                         "Run restarts, by the exit class that caused them.");
  Family<Counter>& worker_exits =
      NewCounter(*registry, "trainsup_worker_exits_total", "Worker process exits, by exit class.");
  Family<Gauge>& heartbeat_age = NewGauge(*registry, "trainsup_worker_heartbeat_age_seconds",
                                          "Seconds since the worker's last heartbeat.");
  Family<Gauge>& step_rate = NewGauge(*registry, "trainsup_worker_step_rate",
                                      "Training steps per second reported by the worker.");
  Family<Gauge>& samples_rate = NewGauge(*registry, "trainsup_worker_samples_per_second",
                                         "Training samples per second reported by the worker.");
  Family<Gauge>& memory =
      NewGauge(*registry, "trainsup_worker_memory_bytes",
               "Worker memory in bytes: current use, peak use and budget (label kind).");
  Family<Gauge>& step =
      NewGauge(*registry, "trainsup_worker_step", "Last training step the worker reported.");
  Family<Gauge>& loss = NewGauge(*registry, "trainsup_worker_loss",
                                 "The loss of the worker's last step (its batch's mean).");
  Family<Gauge>& learning_rate = NewGauge(*registry, "trainsup_worker_learning_rate",
                                          "The learning rate of the worker's last step.");
  Family<Gauge>& oom_splits =
      NewGauge(*registry, "trainsup_worker_oom_splits",
               "Batches or pieces the worker cut in two (out of memory, or planned not to fit), "
               "on the lineage of the run's current model.");
  Family<Gauge>& oom_retries =
      NewGauge(*registry, "trainsup_worker_oom_retries",
               "Forward passes the worker ran again after an out-of-memory error, on the lineage "
               "of the run's current model.");
  Family<Gauge>& oom_wasted_seconds =
      NewGauge(*registry, "trainsup_worker_oom_wasted_seconds",
               "Seconds of forward and backward passes thrown away by out-of-memory errors "
               "(measured), on the lineage of the run's current model.");
  Family<Gauge>& step_compute_seconds =
      NewGauge(*registry, "trainsup_worker_step_compute_seconds",
               "A step's seconds outside collectives (computing, not waiting for the other "
               "ranks): the straggler window's median when detection is on, else the last step's.");
  Family<Gauge>& straggler =
      NewGauge(*registry, "trainsup_worker_straggler",
               "1 while the rank is a straggler (distributed.straggler_factor), else 0.");
  Family<Gauge>& run_val_miou =
      NewGauge(*registry, "trainsup_run_val_miou",
               "The run's last validation mIoU (rank 0's evaluation); absent before the first.");
  Family<Gauge>& checkpoint_age = NewGauge(*registry, "trainsup_checkpoint_age_seconds",
                                           "Seconds since the run's newest verified checkpoint.");
  Family<Gauge>& slot_state = NewGauge(*registry, "trainsup_slot_state",
                                       "1 for the slot's current state, 0 for the others.");
  Family<Gauge>& slot_healthy =
      NewGauge(*registry, "trainsup_slot_healthy", "1 unless the slot's GPU is stranded.");
  Family<Counter>& gpu_stranded =
      NewCounter(*registry, "trainsup_gpu_stranded_total", "Times a GPU was marked STRANDED.");
  Family<Counter>& store_failures =
      NewCounter(*registry, "trainsup_store_write_failures_total",
                 "State-store writes that failed (each is retried), by what was written.");
  Family<Gauge>& waiting_for_space =
      NewGauge(*registry, "trainsup_runs_waiting_for_space",
               "Runs waiting for disk space before their next attempt.");
  Family<Counter>& checkpoint_failures =
      NewCounter(*registry, "trainsup_checkpoint_save_failures_total",
                 "Checkpoint saves that workers reported as failed, by run.");
  Family<Counter>& nonfinite_steps =
      NewCounter(*registry, "trainsup_nonfinite_steps_total",
                 "Steps the training guard did not apply because a value was not finite, by run.");
  Family<Counter>& spike_steps =
      NewCounter(*registry, "trainsup_spike_steps_total",
                 "Steps the training guard did not apply because the loss spiked, by run.");
  Family<Counter>& rollbacks = NewCounter(
      *registry, "trainsup_rollbacks_total",
      "Rollbacks of diverged attempts to a checkpoint before the first bad step, by run.");
  Family<Counter>& resizes =
      NewCounter(*registry, "trainsup_resizes_total",
                 "Elastic gangs that started an attempt at another size, by run and direction "
                 "(shrink, grow).");
  Family<Gauge>& run_world_size =
      NewGauge(*registry, "trainsup_run_world_size",
               "The ranks of the run's running gang (below the spec's world_size when an "
               "elastic gang runs smaller; 0 while none runs).");
  Family<Gauge>& run_blocked =
      NewGauge(*registry, "trainsup_run_blocked_seconds",
               "How long the run has waited because drained slots leave fewer usable slots than "
               "its smallest gang needs (0 while it does not; elastic.max_blocked_s fails it).");
  Family<Gauge>& run_steps =
      NewGauge(*registry, "trainsup_run_steps",
               "Steps of the run by what became of them (kind: applied, skipped_window, "
               "skipped_guard, skipped_scaler), on the lineage of its current model.");
  Family<Gauge>& etcd_reachable =
      NewGauge(*registry, "trainsup_cluster_etcd_reachable",
               "Multi-node runs: 1 while the job's etcd answers this daemon, 0 while it does not.");
  Family<Gauge>& cluster_generation = NewGauge(*registry, "trainsup_cluster_generation",
                                               "Multi-node runs: the job's restart generation.");
  Family<Gauge>& daemon_info =
      NewGauge(*registry, "trainsup_daemon_info", "Always 1, labelled with the daemon version.");
  Family<Gauge>& daemon_start_time =
      NewGauge(*registry, "trainsup_daemon_start_time_seconds", "Unix time the daemon started.");
  Family<Counter>& api_calls = NewCounter(*registry, "trainsup_api_calls_total",
                                          "API calls, by method and gRPC status code.");

  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;

  struct SlotSeries {
    std::string gpu;
    std::set<std::string> states;  // the state label values with a series
  };

  // Guards the bookkeeping below, and makes each multi-series call (and
  // any call that may race with a removal of its series) one step. A
  // std::mutex rather than absl::Mutex so that ThreadSanitizer sees it.
  std::mutex mu;
  std::set<std::string> run_states;
  // Keyed by run, then rank, so RemoveRun finds a run's workers.
  std::map<std::string, std::set<int>> workers;
  std::map<std::string, std::string> cluster_jobs;  // run -> job, for RemoveRun
  std::map<int, SlotSeries> slots;
  std::string daemon_version;
  bool has_daemon_info = false;

  // The series of one worker labelled {run, rank} only, with their values
  // in `sample` (or 0 without one), in one order for SetWorker and removal.
  std::vector<std::pair<Family<Gauge>*, double>> WorkerGauges(const WorkerSample& s) {
    return {{&heartbeat_age, s.heartbeat_age_s},
            {&step_rate, s.steps_per_s},
            {&samples_rate, s.samples_per_s},
            {&step, s.step},
            {&loss, s.loss},
            {&learning_rate, s.learning_rate},
            {&oom_splits, s.oom_splits},
            {&oom_retries, s.oom_retries},
            {&oom_wasted_seconds, s.oom_wasted_s},
            {&step_compute_seconds, s.step_compute_s},
            {&straggler, s.straggler}};
  }

  // Requires mu.
  void RemoveWorkerLocked(const std::string& run_id, int rank) {
    const Labels labels = {{"run", run_id}, {"rank", std::to_string(rank)}};
    for (const auto& [family, value] : WorkerGauges({})) RemoveSeries(*family, labels);
    for (const char* kind : kMemoryKinds) {
      Labels with_kind = labels;
      with_kind["kind"] = kind;
      RemoveSeries(memory, with_kind);
    }
  }
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& address,
                                                         bool allow_remote) {
  auto impl = std::make_unique<Impl>();
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    // Every run state reads 0 from the start rather than being absent.
    for (const char* state : kRunStates) {
      impl->runs.Add({{"state", state}}).Set(0);
      impl->run_states.insert(state);
    }
  }
  if (!address.empty()) {
    absl::StatusOr<bool> loopback = IsLoopbackAddress(address);
    if (!loopback.ok()) return loopback.status();
    if (!*loopback && !allow_remote) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics address \"", address,
                       "\" is not a loopback address; set metrics_allow_remote to serve "
                       "metrics to other machines"));
    }
    // CivetServer (inside Exposer) throws when it cannot start, typically
    // because the port is taken or the address is not on this machine.
    try {
      impl->exposer = std::make_unique<prometheus::Exposer>(address, 2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics endpoint on \"", address, "\" did not start: ", e.what()));
    }
    impl->exposer->RegisterCollectable(impl->registry);
    const std::vector<int> ports = impl->exposer->GetListeningPorts();
    if (!ports.empty()) impl->port = ports.front();
  }
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Metrics::~Metrics() = default;

int Metrics::port() const { return impl_->port; }

void Metrics::SetRunsByState(const std::map<std::string, int>& counts) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::map<std::string, int> upper;
  for (const auto& [state, count] : counts) upper[absl::AsciiStrToUpper(state)] += count;
  for (const auto& [state, count] : upper) impl_->run_states.insert(state);
  for (const std::string& state : impl_->run_states) {
    const auto it = upper.find(state);
    impl_->runs.Add({{"state", state}}).Set(it == upper.end() ? 0 : it->second);
  }
}

void Metrics::CountRestart(const std::string& reason) {
  impl_->restarts.Add({{"reason", reason}}).Increment();
}

void Metrics::CountWorkerExit(const std::string& exit_class) {
  impl_->worker_exits.Add({{"class", exit_class}}).Increment();
}

void Metrics::SetWorker(const std::string& run_id, int rank, const WorkerSample& sample) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->workers[run_id].insert(rank);
  const Labels labels = {{"run", run_id}, {"rank", std::to_string(rank)}};
  for (const auto& [family, value] : impl_->WorkerGauges(sample)) family->Add(labels).Set(value);
  const double memory[] = {sample.memory_current, sample.memory_peak, sample.memory_budget};
  for (int i = 0; i < 3; ++i) {
    Labels with_kind = labels;
    with_kind["kind"] = kMemoryKinds[i];
    impl_->memory.Add(with_kind).Set(memory[i]);
  }
}

void Metrics::RemoveWorker(const std::string& run_id, int rank) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto run = impl_->workers.find(run_id);
  if (run == impl_->workers.end() || run->second.erase(rank) == 0) return;
  if (run->second.empty()) impl_->workers.erase(run);
  impl_->RemoveWorkerLocked(run_id, rank);
}

void Metrics::SetCheckpointAge(const std::string& run_id, double age_s) {
  // Under the lock: RemoveRun may delete this series while it is being set.
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->checkpoint_age.Add({{"run", run_id}}).Set(age_s);
}

void Metrics::SetCluster(const std::string& run_id, const std::string& job, bool etcd_reachable,
                         int64_t generation) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->etcd_reachable.Add({{"run", run_id}, {"job", job}}).Set(etcd_reachable ? 1 : 0);
  impl_->cluster_generation.Add({{"run", run_id}, {"job", job}})
      .Set(static_cast<double>(generation));
  impl_->cluster_jobs[run_id] = job;
}

void Metrics::RemoveRun(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (auto job = impl_->cluster_jobs.find(run_id); job != impl_->cluster_jobs.end()) {
    RemoveSeries(impl_->etcd_reachable, {{"run", run_id}, {"job", job->second}});
    RemoveSeries(impl_->cluster_generation, {{"run", run_id}, {"job", job->second}});
    impl_->cluster_jobs.erase(job);
  }
  RemoveSeries(impl_->checkpoint_age, {{"run", run_id}});
  RemoveSeries(impl_->checkpoint_failures, {{"run", run_id}});
  RemoveSeries(impl_->nonfinite_steps, {{"run", run_id}});
  RemoveSeries(impl_->spike_steps, {{"run", run_id}});
  RemoveSeries(impl_->rollbacks, {{"run", run_id}});
  for (const char* d : {"shrink", "grow"})
    RemoveSeries(impl_->resizes, {{"run", run_id}, {"direction", d}});
  RemoveSeries(impl_->run_world_size, {{"run", run_id}});
  RemoveSeries(impl_->run_blocked, {{"run", run_id}});
  RemoveSeries(impl_->run_val_miou, {{"run", run_id}});
  for (const char* kind : {"applied", "skipped_window", "skipped_guard", "skipped_scaler"}) {
    RemoveSeries(impl_->run_steps, {{"run", run_id}, {"kind", kind}});
  }
  const auto run = impl_->workers.find(run_id);
  if (run == impl_->workers.end()) return;
  for (int rank : run->second) impl_->RemoveWorkerLocked(run_id, rank);
  impl_->workers.erase(run);
}

void Metrics::SetSlot(int slot, const std::string& gpu, const std::string& state) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const std::string slot_label = std::to_string(slot);
  const std::string current = absl::AsciiStrToUpper(state);
  Impl::SlotSeries& series = impl_->slots[slot];
  std::set<std::string> states(std::begin(kSlotStates), std::end(kSlotStates));
  states.insert(current);
  // Series that the new one-hot set does not cover: all of them when the
  // gpu label changed, else a previous state outside the four.
  for (const std::string& old : series.states) {
    if (series.gpu != gpu || states.count(old) == 0) {
      RemoveSeries(impl_->slot_state, {{"slot", slot_label}, {"gpu", series.gpu}, {"state", old}});
    }
  }
  if (series.gpu != gpu && !series.states.empty()) {
    RemoveSeries(impl_->slot_healthy, {{"slot", slot_label}, {"gpu", series.gpu}});
  }
  for (const std::string& s : states) {
    impl_->slot_state.Add({{"slot", slot_label}, {"gpu", gpu}, {"state", s}})
        .Set(s == current ? 1 : 0);
  }
  impl_->slot_healthy.Add({{"slot", slot_label}, {"gpu", gpu}})
      .Set(current == kStranded || current == kDrained ? 0 : 1);
  series.gpu = gpu;
  series.states = std::move(states);
}

void Metrics::CountGpuStranded(const std::string& gpu) {
  impl_->gpu_stranded.Add({{"gpu", gpu}}).Increment();
}

void Metrics::CountStoreWriteFailure(const std::string& what) {
  impl_->store_failures.Add({{"what", what}}).Increment();
}

void Metrics::SetRunsWaitingForSpace(int runs) { impl_->waiting_for_space.Add({}).Set(runs); }

void Metrics::CountCheckpointFailures(const std::string& run_id, int64_t n) {
  if (n > 0) impl_->checkpoint_failures.Add({{"run", run_id}}).Increment(static_cast<double>(n));
}

void Metrics::CountGuardSteps(const std::string& run_id, int64_t nonfinite, int64_t spikes) {
  if (nonfinite > 0) {
    impl_->nonfinite_steps.Add({{"run", run_id}}).Increment(static_cast<double>(nonfinite));
  }
  if (spikes > 0) impl_->spike_steps.Add({{"run", run_id}}).Increment(static_cast<double>(spikes));
}

void Metrics::CountResize(const std::string& run_id, const std::string& direction) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->resizes.Add({{"run", run_id}, {"direction", direction}}).Increment();
}

void Metrics::SetRunWorldSize(const std::string& run_id, int world_size) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->run_world_size.Add({{"run", run_id}}).Set(world_size);
}

void Metrics::SetRunBlocked(const std::string& run_id, double seconds) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->run_blocked.Add({{"run", run_id}}).Set(seconds);
}

void Metrics::SetRunSteps(const std::string& run_id, int64_t applied, int64_t skipped_window,
                          int64_t skipped_guard, int64_t skipped_scaler) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [kind, n] : {std::pair{"applied", applied},
                                {"skipped_window", skipped_window},
                                {"skipped_guard", skipped_guard},
                                {"skipped_scaler", skipped_scaler}}) {
    impl_->run_steps.Add({{"run", run_id}, {"kind", kind}}).Set(static_cast<double>(n));
  }
}

void Metrics::SetRunValMiou(const std::string& run_id, double miou) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (miou < 0) {
    RemoveSeries(impl_->run_val_miou, {{"run", run_id}});
  } else {
    impl_->run_val_miou.Add({{"run", run_id}}).Set(miou);
  }
}

void Metrics::CountRollback(const std::string& run_id) {
  impl_->rollbacks.Add({{"run", run_id}}).Increment();
}

void Metrics::SetDaemonInfo(const std::string& version, double start_time_s) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->has_daemon_info && impl_->daemon_version != version) {
    RemoveSeries(impl_->daemon_info, {{"version", impl_->daemon_version}});
  }
  impl_->daemon_info.Add({{"version", version}}).Set(1);
  impl_->daemon_start_time.Add({}).Set(start_time_s);
  impl_->daemon_version = version;
  impl_->has_daemon_info = true;
}

void Metrics::CountApiCall(const std::string& method, const std::string& code) {
  // gRPC's status codes are absl's, number for number.
  int number = -1;
  const bool numeric = absl::SimpleAtoi(code, &number) && number >= 0 && number <= 16;
  const std::string name =
      numeric ? absl::StatusCodeToString(static_cast<absl::StatusCode>(number)) : code;
  impl_->api_calls.Add({{"method", method}, {"code", name}}).Increment();
}

std::string Metrics::Scrape() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace trainsup::supervisor
