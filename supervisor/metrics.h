// The daemon's Prometheus metrics: a small facade over prometheus-cpp that
// the event loop feeds with plain values, and an optional /metrics HTTP
// endpoint (prometheus-cpp's Exposer) that serves them in the text
// exposition format. docs/operations.md lists every metric and its meaning;
// deploy/grafana/trainsup-dashboard.json charts them.
//
//   trainsup_runs{state}                                  gauge
//   trainsup_restarts_total{reason}                       counter
//   trainsup_worker_exits_total{class}                    counter
//   trainsup_worker_heartbeat_age_seconds{run,rank}       gauge
//   trainsup_worker_step_rate{run,rank}                   gauge, steps/s
//   trainsup_worker_samples_per_second{run,rank}          gauge
//   trainsup_worker_memory_bytes{run,rank,kind}           gauge, kind = current|peak|budget
//   trainsup_worker_step{run,rank}                        gauge
//   trainsup_worker_loss{run,rank}                        gauge, the last step's
//   trainsup_worker_learning_rate{run,rank}               gauge, the last step's
//   trainsup_worker_oom_splits{run,rank}                  gauge, on the model's lineage
//   trainsup_worker_oom_retries{run,rank}                 gauge, on the model's lineage
//   trainsup_worker_oom_wasted_seconds{run,rank}          gauge, on the model's lineage
//   trainsup_run_val_miou{run}                            gauge, the last evaluation's
//   trainsup_worker_step_compute_seconds{run,rank}        gauge, outside collectives
//   trainsup_worker_straggler{run,rank}                   gauge, 1 while a straggler
//   trainsup_checkpoint_age_seconds{run}                  gauge
//   trainsup_slot_state{slot,gpu,state}                   gauge, 1 for the current state
//   trainsup_slot_healthy{slot,gpu}                       gauge, 0 while STRANDED or DRAINED
//   trainsup_gpu_stranded_total{gpu}                      counter
//   trainsup_daemon_info{version}                         gauge, always 1
//   trainsup_daemon_start_time_seconds                    gauge, unix time
//   trainsup_api_calls_total{method,code}                 counter
//   trainsup_store_write_failures_total{what}             counter
//   trainsup_runs_waiting_for_space                       gauge
//   trainsup_checkpoint_save_failures_total{run}          counter
//   trainsup_nonfinite_steps_total{run}                   counter
//   trainsup_spike_steps_total{run}                       counter
//   trainsup_rollbacks_total{run}                         counter
//   trainsup_resizes_total{run,direction}                 counter, direction = shrink|grow
//   trainsup_run_world_size{run}                          gauge, ranks of the running gang
//   trainsup_run_blocked_seconds{run}                     gauge, waited for drained slots (0: not)
//   trainsup_run_steps{run,kind}                          gauge, kind = applied|skipped_window|
//                                                         skipped_guard|skipped_scaler
//   trainsup_cluster_etcd_reachable{run,job}              gauge, 1/0
//   trainsup_cluster_generation{run,job}                  gauge
//
// Thread safety: every method may be called from any thread. Each call is
// applied under one lock, so a call that touches several series (SetSlot,
// RemoveWorker, SetRunsByState) never interleaves with another call; a
// concurrent scrape reads each series atomically (prometheus-cpp's business)
// but may see a multi-series update half applied.
#ifndef TRAINSUP_SUPERVISOR_METRICS_H_
#define TRAINSUP_SUPERVISOR_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace trainsup::supervisor {

class Metrics {
 public:
  // Makes the metrics and, unless `address` is empty, starts the HTTP
  // endpoint serving them at /metrics on `address`, "host:port" with host
  // an IPv4 address, "[IPv6 address]" or a host name and port 0..65535
  // (0: a free port, see port()). "" = no endpoint: values are still kept
  // and Scrape() works. InvalidArgument for a malformed address, or for a
  // host that is not loopback (127.0.0.0/8, [::1], "localhost"; any other
  // host name counts as remote) unless `allow_remote`; Unavailable when the
  // endpoint cannot be started (the port is taken, the address is not on
  // this machine, IPv6 where civetweb was built without it).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& address,
                                                         bool allow_remote);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The TCP port the endpoint listens on (the chosen one when the address
  // said port 0); 0 when there is no endpoint.
  int port() const;

  // trainsup_runs{state}: how many runs are in each state, state as the
  // RunState name without its prefix ("PENDING", "RUNNING", ...; matched
  // case-insensitively, exported in upper case). The seven run states read
  // 0 from Create on, and every state named before that is absent from
  // `counts` is set to 0, so a state that empties reads 0.
  void SetRunsByState(const std::map<std::string, int>& counts);

  // trainsup_restarts_total{reason} += 1; reason is the exit class name
  // that caused the restart ("crash", "oom", "hung", ...).
  void CountRestart(const std::string& reason);

  // trainsup_worker_exits_total{class} += 1, for every worker exit,
  // restarted or not; exit_class as for CountRestart.
  void CountWorkerExit(const std::string& exit_class);

  // The latest heartbeat-derived figures of one worker.
  struct WorkerSample {
    double heartbeat_age_s = 0;  // seconds since its last heartbeat
    double steps_per_s = 0;
    double samples_per_s = 0;
    double memory_current = 0;  // bytes
    double memory_peak = 0;     // bytes
    double memory_budget = 0;   // bytes
    double step = 0;            // last reported training step
    double loss = 0;            // the last step's
    double learning_rate = 0;   // the last step's
    // Counts on the lineage of the run's current model (the worker's
    // checkpointed counters: they go back with a rollback or a restart
    // from an older checkpoint, so these are gauges, not counters).
    double oom_splits = 0;
    double oom_retries = 0;
    double oom_wasted_s = 0;  // seconds of passes thrown away by out-of-memory errors
    // A step's seconds outside collectives (the straggler window's median
    // when detection is on), and 1 while the rank is a straggler.
    double step_compute_s = 0;
    double straggler = 0;
  };

  // Sets the worker series of (run_id, rank): heartbeat age, step rate,
  // samples/s, memory (kind=current|peak|budget), step, loss, learning
  // rate and the out-of-memory splits, retries and wasted seconds, each labelled
  // run="<run_id>", rank="<rank>". Creates them on first call.
  void SetWorker(const std::string& run_id, int rank, const WorkerSample& sample);

  // Removes every series SetWorker made for (run_id, rank), so a worker
  // that is gone leaves no stale values. No-op when there are none.
  void RemoveWorker(const std::string& run_id, int rank);

  // trainsup_checkpoint_age_seconds{run}: seconds since the run's newest
  // verified checkpoint.
  void SetCheckpointAge(const std::string& run_id, double age_s);

  // Removes every series of the run: its checkpoint age and the worker
  // series of all its ranks. Call when a run ends.
  void RemoveRun(const std::string& run_id);

  // A multi-node run (docs/distributed.md):
  // trainsup_cluster_etcd_reachable{run,job} 1/0 and
  // trainsup_cluster_generation{run,job}. RemoveRun drops them.
  void SetCluster(const std::string& run_id, const std::string& job, bool etcd_reachable,
                  int64_t generation);

  // trainsup_slot_state{slot,gpu,state}: one-hot, 1 for `state` and 0 for
  // each other of FREE, BUSY, RELEASING, STRANDED, DRAINED;
  // trainsup_slot_healthy{slot,gpu}: 0 while STRANDED or DRAINED, else 1. `state` is matched case-
  // insensitively and exported in upper case; any other name gets a series
  // of its own (1) beside the four (0). `gpu` is the GPU's identifier
  // ("" for a CPU slot); when a slot's gpu changes, the old series go.
  void SetSlot(int slot, const std::string& gpu, const std::string& state);

  // trainsup_gpu_stranded_total{gpu} += 1: the GPU was marked STRANDED.
  void CountGpuStranded(const std::string& gpu);

  // trainsup_store_write_failures_total{what} += 1: a state-store write
  // failed ("what": the kind of transition, e.g. "attempt ended").
  void CountStoreWriteFailure(const std::string& what);

  // trainsup_runs_waiting_for_space = runs.
  void SetRunsWaitingForSpace(int runs);

  // trainsup_checkpoint_save_failures_total{run} += n (n <= 0: nothing).
  void CountCheckpointFailures(const std::string& run_id, int64_t n);
  // The training guard (docs/guard.md): trainsup_nonfinite_steps_total{run}
  // += nonfinite, trainsup_spike_steps_total{run} += spikes (steps not
  // applied), trainsup_rollbacks_total{run} += 1 per rollback. RemoveRun
  // drops them.
  void CountGuardSteps(const std::string& run_id, int64_t nonfinite, int64_t spikes);
  void CountRollback(const std::string& run_id);
  // Elastic gangs (docs/distributed.md, "Elastic"): an attempt started at
  // another size than the last (direction "shrink" or "grow"), and the
  // size of the running gang (0 while none runs).
  void CountResize(const std::string& run_id, const std::string& direction);
  void SetRunWorldSize(const std::string& run_id, int world_size);
  // How long the run has waited because drains leave fewer usable slots
  // than its smallest gang (0 while it does not).
  void SetRunBlocked(const std::string& run_id, double seconds);
  // What the run trained (rank 0's tally, docs/guard.md): steps applied and
  // skipped, by kind. RemoveRun drops them.
  void SetRunSteps(const std::string& run_id, int64_t applied, int64_t skipped_window,
                   int64_t skipped_guard, int64_t skipped_scaler);

  // trainsup_run_val_miou{run} = miou; a negative miou (none yet) removes
  // the series. RemoveRun drops it.
  void SetRunValMiou(const std::string& run_id, double miou);

  // trainsup_daemon_info{version} = 1 (only the latest version has a
  // series) and trainsup_daemon_start_time_seconds = start_time_s (unix
  // time).
  void SetDaemonInfo(const std::string& version, double start_time_s);

  // trainsup_api_calls_total{method,code} += 1; method is the RPC name
  // ("SubmitRun"), code the gRPC status code name ("OK",
  // "INVALID_ARGUMENT"). A numeric code, 0..16 ("3"), is exported as its
  // name, so both spellings count in one series.
  void CountApiCall(const std::string& method, const std::string& code);

  // Every metric in the Prometheus text exposition format (version 0.0.4),
  // exactly what the endpoint serves.
  std::string Scrape() const;

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_METRICS_H_
