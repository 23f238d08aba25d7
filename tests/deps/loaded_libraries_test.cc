// What a process of the worker's kind has loaded, read from /proc/self/maps
// after LibTorch ran an OpenMP parallel region and a product: one OpenMP
// runtime (LibTorch's), the CUDA runtime next to LibTorch (the wheel's, not
// the toolkit's under /usr/local/cuda), and no other LibTorch
// (docs/building.md, "Link hazards").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

// The real paths of the mapped files whose name starts with `stem`.
std::set<std::string> Mapped(const std::string& stem) {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> paths;
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (fs::path(path).filename().string().rfind(stem, 0) == 0) {
      std::error_code ec;
      const fs::path real = fs::canonical(path, ec);
      paths.insert(ec ? path : real.string());
    }
  }
  return paths;
}

std::string Join(const std::set<std::string>& s) {
  std::ostringstream o;
  for (const std::string& p : s) o << p << " ";
  return o.str();
}

bool Below(const std::string& path, const std::string& dir) {
  std::error_code ec;
  const std::string real = fs::canonical(dir, ec).string();
  return !ec && path.rfind(real + "/", 0) == 0;
}

class LoadedLibraries : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(2);
    std::atomic<int64_t> sum{0};
    at::parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) { sum += e - b; });
    ASSERT_EQ(sum.load(), 1000);
    at::Tensor a = at::rand({64, 64});
    ASSERT_TRUE(at::mm(a, a).isfinite().all().item<bool>());
  }
};

TEST_F(LoadedLibraries, OneOpenMpRuntimeAndItIsLibTorchs) {
  const std::set<std::string> gomp = Mapped("libgomp");
  ASSERT_EQ(gomp.size(), 1u) << "OpenMP runtimes mapped: " << Join(gomp);
  const std::string torch_lib = std::string(TRAINSUP_TORCH_ROOT) + "/lib";
  if (fs::exists(torch_lib + "/libgomp.so.1")) {
    EXPECT_TRUE(Below(*gomp.begin(), torch_lib)) << *gomp.begin();
  }
}

TEST_F(LoadedLibraries, CudaRuntimeComesFromNextToLibTorch) {
  const std::set<std::string> cudart = Mapped("libcudart");
  if (cudart.empty()) GTEST_SKIP() << "this LibTorch loads no CUDA runtime (a CPU LibTorch)";
  ASSERT_EQ(cudart.size(), 1u) << Join(cudart);
  EXPECT_EQ(cudart.begin()->find("/usr/local/cuda"), std::string::npos)
      << "the toolkit's CUDA runtime was loaded: " << *cudart.begin();
  const std::string root = std::string(TRAINSUP_TORCH_ROOT) + "/..";
  EXPECT_TRUE(Below(*cudart.begin(), root) || Below(*cudart.begin(), TRAINSUP_TORCH_ROOT))
      << *cudart.begin();
  for (const char* stem : {"libcublas", "libnccl", "libcudnn"}) {
    for (const std::string& p : Mapped(stem)) {
      EXPECT_EQ(p.find("/usr/local/cuda"), std::string::npos) << p;
    }
  }
}

TEST_F(LoadedLibraries, OneLibTorchAndItIsTheBuildsOwn) {
  const std::set<std::string> cpu = Mapped("libtorch_cpu");
  ASSERT_EQ(cpu.size(), 1u) << Join(cpu);
  EXPECT_TRUE(Below(*cpu.begin(), TRAINSUP_TORCH_ROOT)) << *cpu.begin();
  for (const std::string& p : Mapped("libc10")) {
    EXPECT_TRUE(Below(p, TRAINSUP_TORCH_ROOT)) << p;
  }
}

}  // namespace
