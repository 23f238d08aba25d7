// The benchmark's heartbeating worker (torch-free, through the same
// SupervisorLink as the real worker). Its behaviour comes from the run's
// name in DIR/spec.toml:
//   freeze-*  connect, heartbeat and progress for 1.5 s, then stop
//             heartbeating, append "paused <attempt> <unix us>" to
//             DIR/bench-times.txt, and sleep until killed;
//   idle-*    heartbeat and advance progress once a second until killed.
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "contracts/spec.h"
#include "worker/link/link.h"

namespace {

long long NowUs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

}  // namespace

int main(int argc, char** argv) {
  std::string run_dir, endpoint, run_id;
  int rank = 0, attempt = 1, world = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--run-dir") run_dir = v;
    if (k == "--supervisor") endpoint = v;
    if (k == "--rank") rank = std::atoi(v.c_str());
    if (k == "--attempt") attempt = std::atoi(v.c_str());
    if (k == "--world-size") world = std::atoi(v.c_str());
  }
  std::ifstream in(run_dir + "/spec.toml");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<trainsup::RunSpec> spec = trainsup::ParseRunSpec(text.str());
  if (!spec.ok()) return 64;
  const char* id = std::getenv("TRAINSUP_RUN_ID");
  const char* token = std::getenv("TRAINSUP_TOKEN");
  trainsup::worker::LinkOptions options;
  options.endpoint = endpoint;
  options.run_id = id ? id : "";
  options.rank = rank;
  options.attempt = attempt;
  options.world_size = world;
  options.token = token ? token : "";
  trainsup::worker::SupervisorLink link(options);
  link.Start();
  bool freeze = spec->name.rfind("freeze", 0) == 0;
  auto started = std::chrono::steady_clock::now();
  for (int64_t step = 1;; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(freeze ? 100 : 1000));
    link.AdvanceProgress();
    trainsup::v1::Progress p;
    p.set_step(step);
    p.set_total_steps(1000000);
    p.set_phase(trainsup::v1::PHASE_TRAINING);
    link.UpdateProgress(p);
    if (freeze && link.connected() &&
        std::chrono::steady_clock::now() - started > std::chrono::milliseconds(1500)) {
      link.SetHeartbeatsPaused(true);
      std::ofstream(run_dir + "/bench-times.txt", std::ios::app)
          << "paused " << attempt << " " << NowUs() << "\n";
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
  }
}
