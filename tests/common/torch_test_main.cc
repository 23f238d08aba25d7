// Test main for every suite that runs LibTorch: the fast BLAS kernels where
// the CPU has them, and an explicit thread count (Debian's LibTorch starts
// with one; TRAINSUP_THREADS overrides the default of 2).
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "sparse/runtime.h"

int main(int argc, char** argv) {
  trainsup::sparse::EnsureFastBlasKernels(argc, argv);
  const char* threads = std::getenv("TRAINSUP_THREADS");
  at::set_num_threads(threads != nullptr ? std::atoi(threads) : 2);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
