// How long an elastic gang takes to train again after a drain, next to an
// ordinary restart, measured in the same run (docs/distributed.md,
// "Elastic"): one real trainsupd with 3 CPU slots, the real
// trainsup-worker (threads = 1), a gang of 3 with min_world_size 2,
// restart.initial_backoff_s = 0. Each cycle:
//  - drain:   DrainSlot cpu:2 while the gang of 3 trains -> the gang of 2
//             has trained a step (a graceful stop with a checkpoint, then
//             the restart at 2);
//  - grow:    UndrainSlot cpu:2 -> the gang of 3 has trained a step
//             (elastic.grow_after_s = 0.5 included);
//  - restart: SIGKILL rank 0 of the gang of 3 -> the gang of 3 has
//             trained a step (the ordinary crash restart).
// Prints each cycle and the medians, and the ratio drain / restart.
//
//   elastic_bench [cycles]   (default 7)
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace trainsup::integration {
namespace {

const char kSpec[] =
    "name = \"bench\"\nworld_size = 3\nmin_world_size = 2\n"
    "[elastic]\nwait_s = 60\ngrow_after_s = 0.5\n"
    "[model]\narch = \"minkunet14\"\nin_channels = 3\nvoxel_size = 0.1\nsync_batchnorm = true\n"
    "[data]\nformat = \"synthetic\"\nscenes = 10\nscene_size = \"small\"\n"
    "[train]\nbatch_size = 1\nsteps = 1000000\ncheckpoint_every_steps = 20\n"
    "keep_checkpoints = 2\ndeterministic = true\nthreads = 1\n";

// The newest attempt runs `world` ranks, all alive, and has trained a step
// past the checkpoint it resumed from; it is attempt `after` or later.
bool Training(DaemonHarness& h, const std::string& id, int world, int after) {
  v1::Run r = h.GetRun(id);
  if (r.state() != v1::RUN_STATE_RUNNING || r.attempts_size() < after) return false;
  const v1::Attempt& a = r.attempts(r.attempts_size() - 1);
  if (a.number() < after || a.world_size() != world || a.ranks_size() != world) return false;
  for (const v1::RankStatus& s : a.ranks()) {
    if (!s.alive()) return false;
  }
  return a.ranks(0).progress().step() > std::max<int64_t>(a.resumed_from_step(), 0);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int cycles) {
  std::printf(
      "elastic bench: %d cycles, one trainsupd, 3 CPU slots, real trainsup-worker "
      "(threads = 1, intra-op threads set by train.threads), gang of 3 (min 2), backoff 0\n",
      cycles);
  DaemonHarness h;
  UseRealWorker(h, 3);
  h.Set("restart.initial_backoff_s", "0");
  h.Set("restart.max_restarts", "1000");
  h.Set("restart.crash_loop_attempts", "1000");
  if (!h.Start()) return 1;
  const std::string id = h.Submit(kSpec);
  std::vector<double> drains, grows, restarts;
  auto attempt = [&] { return h.GetRun(id).attempts_size(); };
  auto wait = [&](int world, int after, const char* what) {
    if (!Eventually([&] { return Training(h, id, world, after); }, Seconds(300),
                    std::chrono::milliseconds(10))) {
      std::cerr << what << ": the gang did not train again\n" << Describe(h.GetRun(id));
      std::exit(1);
    }
  };
  wait(3, 1, "start");
  for (int c = 0; c < cycles; ++c) {
    // Drain.
    int next = attempt() + 1;
    auto t0 = Clock::now();
    v1::Slot slot;
    if (!h.Drain("cpu:2", "bench", &slot).ok()) return 1;
    wait(2, next, "drain");
    drains.push_back(Seconds(Clock::now() - t0).count());
    // Grow back.
    next = attempt() + 1;
    t0 = Clock::now();
    if (!h.Undrain("cpu:2", &slot).ok()) return 1;
    wait(3, next, "grow");
    grows.push_back(Seconds(Clock::now() - t0).count());
    // An ordinary restart.
    next = attempt() + 1;
    v1::Run r = h.GetRun(id);
    const int pid = r.attempts(r.attempts_size() - 1).ranks(0).pid();
    t0 = Clock::now();
    kill(pid, SIGKILL);
    wait(3, next, "restart");
    restarts.push_back(Seconds(Clock::now() - t0).count());
    std::printf(
        "  cycle %d: drain -> training at 2 %.2f s, undrain -> training at 3 %.2f s, "
        "SIGKILL -> training at 3 %.2f s\n",
        c + 1, drains.back(), grows.back(), restarts.back());
  }
  const double d = Median(drains), g = Median(grows), k = Median(restarts);
  std::printf("\nmedian over %d cycles\n", cycles);
  std::printf("drain to training at 2 ranks      %6.2f s\n", d);
  std::printf("undrain to training at 3 ranks    %6.2f s\n", g);
  std::printf("SIGKILL to training at 3 ranks    %6.2f s (ordinary restart)\n", k);
  std::printf("ratio drain / ordinary restart    %6.2fx\n", d / k);
  return 0;
}

}  // namespace
}  // namespace trainsup::integration

int main(int argc, char** argv) {
  const int cycles = argc > 1 ? std::atoi(argv[1]) : 7;
  return trainsup::integration::Main(cycles < 1 ? 7 : cycles);
}
