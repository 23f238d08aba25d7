// Checkpoint save and load throughput for a 50 MB and a 500 MB training
// state (model parameters plus SGD momentum), next to the disk's own rate
// for the same bytes written with plain write() + fsync() in the same run.
// Also how long the training thread is blocked per asynchronous save
// (snapshot to host memory) against the whole save. Prints medians over
// --repeats; --json prints one JSON object.
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <stdlib.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/state.h"

namespace ck = trainsup::ckpt;

namespace {

// checkpoint/ depends on nothing else of ours (docs/design.md), so the two
// timing helpers are its own.
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Net : torch::nn::Module {
  explicit Net(int64_t floats) {
    const int64_t per = 1 << 20;  // 4 MiB tensors, like large conv weights
    for (int64_t i = 0; floats > 0; ++i, floats -= per) {
      register_parameter("w" + std::to_string(i), torch::randn({std::min(per, floats)}));
    }
  }
};

// The disk's rate: the same bytes, plain write() of 64 MiB pieces and one
// fsync, into the same directory.
double RawWriteSeconds(const std::string& dir, const std::vector<at::Tensor>& data) {
  const std::string path = dir + "/raw.bin";
  const double t0 = Now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    std::perror("open");
    std::exit(1);
  }
  for (const at::Tensor& t : data) {
    const char* p = static_cast<const char*>(t.data_ptr());
    size_t left = t.numel() * t.element_size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 26));
      if (n <= 0) {
        std::perror("write");
        std::exit(1);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  ::fsync(fd);
  ::close(fd);
  const double s = Now() - t0;
  ::unlink(path.c_str());
  return s;
}

// Drops the files' pages from the page cache, so loads read from the disk.
void Evict(const std::string& dir) {
  auto names = ck::FileSystem::Default()->ListDir(dir);
  if (!names.ok()) return;
  for (const auto& n : *names) {
    const std::string p = dir + "/" + n;
    int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// The command line.
struct Options {
  int repeats = 3;
  bool json = false;
  std::string base = "/var/tmp";
  // 90 MB: the demo's state (MinkUNet14 at the default width, 45 MB of
  // weights, plus as much SGD momentum); 500 MB: a large model's.
  std::vector<int64_t> sizes_mb = {90, 500};
};

// Reads the flags into *options; on an unknown flag, or one without its
// value, prints the usage to stderr and returns false.
bool ParseArgs(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      options->json = true;
    } else if (a == "--repeats" && i + 1 < argc) {
      options->repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--dir" && i + 1 < argc) {
      options->base = argv[++i];
    } else if (a == "--sizes-mb" && i + 1 < argc) {
      options->sizes_mb.clear();
      std::stringstream ss(argv[++i]);
      for (std::string x; std::getline(ss, x, ',');) {
        options->sizes_mb.push_back(std::atoll(x.c_str()));
      }
    } else {
      std::fprintf(
          stderr,
          "usage: checkpoint_bench [--repeats N] [--json] [--dir DIR] [--sizes-mb 90,500]\n");
      return false;
    }
  }
  return true;
}

// One state size's times in seconds, one entry per repeat, and the bytes
// of its snapshot.
struct Timings {
  std::vector<double> raw, save, blocked, async_total, load;
  uint64_t bytes = 0;
};

// One repeat on the state (net, sgd) of `mb` MB: the raw write into `dir`,
// a synchronous save, an asynchronous one and a load from the disk, each
// time appended to *timings; *step counts the saves. Prints why to stderr
// and returns false when a save or the load fails.
bool TimeRepeat(const std::string& dir, int64_t mb, const std::vector<at::Tensor>& raw_data,
                ck::CheckpointStore& store, Net& net, torch::optim::SGD& sgd, int64_t* step,
                Timings* timings) {
  timings->raw.push_back(RawWriteSeconds(dir, raw_data));
  // Synchronous save of the live state: write + fsync + commit.
  ck::TrainerState t;
  t.step = ++*step;
  double t0 = Now();
  absl::Status saved = ck::SaveState(store, net, sgd, t);
  if (!saved.ok()) {
    std::fprintf(stderr, "save failed: %s\n", std::string(saved.message()).c_str());
    return false;
  }
  timings->save.push_back(Now() - t0);
  timings->bytes = ck::Snapshot(net, sgd, t, /*copy=*/false)->bytes();
  // Asynchronous save: the training thread pays for the snapshot only.
  {
    ck::AsyncCheckpointer saver(&store);
    t.step = ++*step;
    t0 = Now();
    auto s2 = ck::Snapshot(net, sgd, t);
    (void)saver.Save(std::move(*s2));
    const double b = Now() - t0;
    std::optional<ck::WriteResult> written = saver.Wait();
    if (!written.has_value() || !written->status.ok()) {
      std::fprintf(stderr, "async save failed\n");
      return false;
    }
    timings->blocked.push_back(b);
    timings->async_total.push_back(Now() - t0);
  }
  // Load: choose (verifies every hash) + read + apply, from the disk.
  auto latest = store.ChooseLatest(nullptr);
  Evict(latest->path);
  Net fresh(mb * (1 << 20) / 8);
  torch::optim::SGD fresh_sgd(fresh.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  t0 = Now();
  latest = store.ChooseLatest(nullptr);
  ck::TrainerState loaded;
  if (!latest.ok() || !ck::LoadState(store, *latest, fresh, fresh_sgd, &loaded).ok()) {
    std::fprintf(stderr, "load failed\n");
    return false;
  }
  timings->load.push_back(Now() - t0);
  return true;
}

// Builds a training state of `mb` MB and times `repeats` repeats on it,
// its checkpoints under dir/run<mb>/. False when a repeat failed (it said why).
bool BenchSize(const std::string& dir, int64_t mb, int repeats, Timings* timings) {
  // Half parameters, half momentum buffers.
  Net net(mb * (1 << 20) / 8);
  torch::optim::SGD sgd(net.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  for (auto& p : net.parameters()) p.mutable_grad() = torch::randn_like(p);
  sgd.step();
  std::vector<at::Tensor> raw_data;
  for (auto& p : net.parameters()) raw_data.push_back(p.detach());
  for (auto& p : net.parameters()) raw_data.push_back(p.detach().clone());
  ck::CheckpointStore store(dir + "/run" + std::to_string(mb) + "/checkpoints",
                            ck::FileSystem::Default(), {/*keep_last=*/2, 0});
  int64_t step = 0;
  for (int r = 0; r < repeats; ++r) {
    if (!TimeRepeat(dir, mb, raw_data, store, net, sgd, &step, timings)) return false;
  }
  return true;
}

// Appends the medians of one state size to the JSON object `js` and,
// unless `json`, prints them as a line.
void ReportSize(int64_t mb, const Timings& timings, bool json, std::ostringstream& js) {
  const uint64_t bytes = timings.bytes;
  const double mib = bytes / double(1 << 20);
  const double raw_rate = mib / Median(timings.raw), save_rate = mib / Median(timings.save),
               load_rate = mib / Median(timings.load);
  const std::string k = "state_" + std::to_string(mb) + "mb";
  js << ", \"" << k << "_bytes\": " << bytes << ", \"" << k
     << "_raw_write_fsync_mib_s\": " << raw_rate << ", \"" << k << "_save_mib_s\": " << save_rate
     << ", \"" << k << "_save_vs_raw\": " << save_rate / raw_rate << ", \"" << k
     << "_load_mib_s\": " << load_rate << ", \"" << k
     << "_async_blocked_s\": " << Median(timings.blocked) << ", \"" << k
     << "_async_total_s\": " << Median(timings.async_total) << ", \"" << k
     << "_blocked_sync_over_background\": " << Median(timings.save) / Median(timings.blocked);
  if (!json) {
    std::printf(
        "state %4lld MB (%.1f MiB written): raw write+fsync %7.1f MiB/s | save %7.1f MiB/s = "
        "%.2fx raw | "
        "load (verify+read) %7.1f MiB/s | training thread blocked per checkpoint: synchronous "
        "%.3f s, background %.3f s (%.1fx less; its write took %.3f s)\n",
        static_cast<long long>(mb), mib, raw_rate, save_rate, save_rate / raw_rate, load_rate,
        Median(timings.save), Median(timings.blocked),
        Median(timings.save) / Median(timings.blocked), Median(timings.async_total));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!ParseArgs(argc, argv, &options)) return 64;
  at::set_num_threads(2);
  std::string tmpl = options.base + "/trainsup_ckpt_bench.XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  std::ostringstream js;
  js << "{\"dir\": \"" << dir << "\", \"repeats\": " << options.repeats << ", \"threads\": 2";
  if (!options.json) {
    std::printf("checkpoint_bench: %s, medians of %d runs, 2 threads\n", dir.c_str(),
                options.repeats);
  }
  for (int64_t mb : options.sizes_mb) {
    Timings timings;
    if (!BenchSize(dir, mb, options.repeats, &timings)) return 1;
    ReportSize(mb, timings, options.json, js);
  }
  js << "}";
  if (options.json) std::printf("%s\n", js.str().c_str());
  ck::FileSystem::Default()->DeleteTree(dir).IgnoreError();
  return 0;
}
