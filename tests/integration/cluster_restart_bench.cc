// How long a job takes to come back after a rank dies, across two nodes
// (two real daemons, one real etcd on loopback) next to one daemon with the
// same two ranks, measured in the same run: the real trainsup-worker,
// restart.initial_backoff_s = 0, a rank SIGKILLed once its attempt has
// trained a step, N kills each (default 20). For each kill: the time from
// the SIGKILL to (a) every rank of the next attempt started (a live pid on
// every node) and (b) every rank of it connected (the run RUNNING again on
// every node). Prints medians and the ratio two nodes / one daemon.
//
//   cluster_restart_bench [kills]
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/common/etcd_server.h"
#include "tests/integration/daemon_harness.h"

namespace trainsup::integration {
namespace {

std::string Spec(const std::string& name, const std::string& cluster) {
  return "name = \"" + name + "\"\n" + (cluster.empty() ? "world_size = 2\n" : "") +
         "[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = 0.1\n"
         "[data]\nformat = \"synthetic\"\nscenes = 10\nscene_size = \"small\"\n"
         "[train]\nbatch_size = 1\nsteps = 1000000\ncheckpoint_every_steps = 1000000\n"
         "deterministic = true\nthreads = 1\n" +
         cluster;
}

void Configure(DaemonHarness& h, const std::string& node, int slots) {
  UseRealWorker(h, slots);
  h.Set("restart.initial_backoff_s", "0");
  h.Set("restart.max_restarts", "1000");
  h.Set("restart.crash_loop_attempts", "1000");
  h.Set("cluster.node_name", "\"" + node + "\"");
  h.Set("cluster.advertise_addr", "\"127.0.0.1\"");
}

struct Node {
  DaemonHarness* h;
  std::string id;
};

// The newest attempt's ranks: all alive (with pids) on every node.
bool Started(const std::vector<Node>& nodes, int attempt_at_least) {
  for (const Node& n : nodes) {
    v1::Run r = n.h->GetRun(n.id);
    if (r.attempts_size() < attempt_at_least) return false;
    const v1::Attempt& a = r.attempts(r.attempts_size() - 1);
    if (a.ranks_size() == 0 || a.ended_ms() != 0) return false;
    for (const v1::RankStatus& s : a.ranks()) {
      if (!s.alive() || s.pid() <= 1) return false;
    }
  }
  return true;
}

bool Running(const std::vector<Node>& nodes, int attempt_at_least, int64_t min_step) {
  for (const Node& n : nodes) {
    v1::Run r = n.h->GetRun(n.id);
    if (r.state() != v1::RUN_STATE_RUNNING || r.attempts_size() < attempt_at_least) return false;
    // Every attempt starts from scratch (no checkpoints): a rank's step
    // counts this attempt's training.
    for (const v1::RankStatus& s : r.attempts(r.attempts_size() - 1).ranks()) {
      if (s.progress().step() < min_step) return false;
    }
  }
  return true;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Kills the first rank of the last node `kills` times; the two figures of
// each restart.
std::pair<std::vector<double>, std::vector<double>> Measure(const std::vector<Node>& nodes,
                                                            int kills) {
  std::vector<double> started, running;
  for (int k = 0; k < kills; ++k) {
    const int attempt = k + 1;
    // Trained a step in this attempt (the step counter restarts with it).
    if (!Eventually([&] { return Running(nodes, attempt, 1); }, Seconds(300),
                    std::chrono::milliseconds(20))) {
      std::cerr << "attempt " << attempt << " never ran\n";
      std::exit(1);
    }
    const Node& victim = nodes.back();
    v1::Run r = victim.h->GetRun(victim.id);
    const int pid = r.attempts(r.attempts_size() - 1).ranks(0).pid();
    const auto t0 = Clock::now();
    kill(pid, SIGKILL);
    bool ok = Eventually([&] { return Started(nodes, attempt + 1); }, Seconds(120),
                         std::chrono::milliseconds(10));
    const double s = Seconds(Clock::now() - t0).count();
    ok = ok && Eventually([&] { return Running(nodes, attempt + 1, 0); }, Seconds(120),
                          std::chrono::milliseconds(10));
    const double r_s = Seconds(Clock::now() - t0).count();
    if (!ok) {
      std::cerr << "kill " << k << ": the job did not come back\n";
      std::exit(1);
    }
    started.push_back(s);
    running.push_back(r_s);
    std::printf("  kill %2d: all ranks started %.3f s, all connected %.3f s\n", k + 1, s, r_s);
  }
  return {started, running};
}

int Main(int kills) {
  std::printf(
      "cluster restart bench: %d kills each, real trainsup-worker (threads = 1), "
      "backoff 0, loopback\n",
      kills);
  trainsup::testing::EtcdServer etcd;
  if (absl::Status s = etcd.Start(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  std::vector<double> one_started, one_running, two_started, two_running;
  {
    DaemonHarness one;
    Configure(one, "solo", 2);
    if (!one.Start()) return 1;
    std::printf("one daemon, world size 2:\n");
    std::tie(one_started, one_running) = Measure({{&one, one.Submit(Spec("one", ""))}}, kills);
  }
  {
    DaemonHarness a, b;
    Configure(a, "node-a", 1);
    Configure(b, "node-b", 1);
    const std::string shared = a.dir() + "/shared";
    a.Set("daemon.data_roots", "[\"" + a.data_dir() + "\", \"" + shared + "\"]");
    b.Set("daemon.data_roots", "[\"" + b.data_dir() + "\", \"" + shared + "\"]");
    if (!a.Start() || !b.Start()) return 1;
    const std::string cluster = "[cluster]\njob = \"bench\"\nnodes = 2\netcd_endpoints = [\"" +
                                etcd.endpoint() + "\"]\ncheckpoint_dir = \"" + shared +
                                "/bench\"\nlease_ttl_s = 3\n";
    const std::string spec = Spec("two", cluster);
    std::vector<Node> nodes = {{&a, a.Submit(spec)}, {&b, b.Submit(spec)}};
    std::printf("two daemons (nodes), one rank each, etcd:\n");
    std::tie(two_started, two_running) = Measure(nodes, kills);
  }
  const double os = Median(one_started), orun = Median(one_running);
  const double ts = Median(two_started), trun = Median(two_running);
  std::printf("\nmedian over %d kills        all started   all connected\n", kills);
  std::printf("one daemon, 2 ranks         %8.3f s    %8.3f s\n", os, orun);
  std::printf("two nodes via etcd          %8.3f s    %8.3f s\n", ts, trun);
  std::printf("ratio two nodes / one       %8.2fx    %8.2fx\n", ts / os, trun / orun);
  return 0;
}

}  // namespace
}  // namespace trainsup::integration

int main(int argc, char** argv) {
  const int kills = argc > 1 ? std::atoi(argv[1]) : 20;
  return trainsup::integration::Main(kills < 1 ? 20 : kills);
}
