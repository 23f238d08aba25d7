// The system BLAS (the one LibTorch uses) called directly for the engine's
// per-chunk matrix products, and the knobs around it: which kernel set it
// runs, its thread count, and choosing the fast kernels where the library's
// own detection falls back to slow ones.
#ifndef TRAINSUP_SPARSE_CPU_BLAS_H_
#define TRAINSUP_SPARSE_CPU_BLAS_H_

#include <cstdint>
#include <string>

#include "sparse/runtime.h"  // EnsureFastBlasKernels, BlasCoreName

namespace trainsup::sparse {

// Row-major C[m x n] = op(A) * op(B) + beta * C, single call into BLAS.
// trans_a: A is stored k x m and used transposed (likewise trans_b).
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// The shared object that provides cblas_sgemm (the one Gemm calls).
std::string BlasLibraryPath();
// OpenBLAS's thread count (-1 if not OpenBLAS).
int BlasThreads();
void SetBlasThreads(int n);

// Runs BLAS single-threaded for a scope (the engine parallelises around its
// own calls), restoring the previous count when the last guard alive in the
// process ends. Safe to hold on several threads at once.
class BlasSingleThreadGuard {
 public:
  BlasSingleThreadGuard();
  ~BlasSingleThreadGuard();
  BlasSingleThreadGuard(const BlasSingleThreadGuard&) = delete;
  BlasSingleThreadGuard& operator=(const BlasSingleThreadGuard&) = delete;
};

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_CPU_BLAS_H_
