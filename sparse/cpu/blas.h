// The system BLAS (the one LibTorch uses) called directly for the engine's
// per-chunk matrix products, and the knobs around it: which kernel set it
// runs, its thread count, and choosing the fast kernels where the library's
// own detection falls back to slow ones.
#ifndef TRAINSUP_SPARSE_CPU_BLAS_H_
#define TRAINSUP_SPARSE_CPU_BLAS_H_

#include <cstdint>
#include <string>

namespace trainsup::sparse {

// Row-major C[m x n] = op(A) * op(B) + beta * C, single call into BLAS.
// trans_a: A is stored k x m and used transposed (likewise trans_b).
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// OpenBLAS's kernel set ("SkylakeX", "Haswell", "Prescott", ...), or
// "unknown" when the BLAS is not OpenBLAS.
std::string BlasCoreName();
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

// OpenBLAS 0.3.21 does not recognise recent Xeons and falls back to its
// "Prescott" kernels, about 3x slower. OPENBLAS_CORETYPE is read only when
// the library loads, so a program calls this first thing in main(): when
// OpenBLAS fell back and the CPU supports AVX-512 (or AVX2+FMA), it sets
// OPENBLAS_CORETYPE to SkylakeX (or Haswell) and re-executes the program.
// Does nothing when OPENBLAS_CORETYPE is set already or
// TRAINSUP_KEEP_BLAS_CORETYPE=1. Returns only if no re-exec happened.
void EnsureFastBlasKernels(int argc, char** argv);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_CPU_BLAS_H_
