#include "sparse/cpu/blas.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

// Without a system BLAS (TRAINSUP_SYSTEM_BLAS=0), Gemm is blas_aten.cc's.
// With one, the products go through its CBLAS entry points, never the
// Fortran sgemm_/dgemm_: the torch wheel's libtorch_cpu exports MKL's
// sgemm_ and dgemm_ as well, and which of two same-named symbols a call
// binds to depends on the order the libraries load. It exports no
// cblas_sgemm or cblas_dgemm, so these name OpenBLAS alone
// (tests/sparse/blas_test.cc checks where they resolve).
#if TRAINSUP_SYSTEM_BLAS
extern "C" {
// CBLAS's enums are ints: CblasRowMajor 101, CblasNoTrans 111, CblasTrans 112.
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb, double beta, double* c,
                 int ldc);
}
#endif

namespace trainsup::sparse {
namespace {

template <typename Fn>
Fn Lookup(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

namespace {

constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

template <typename T>
using CblasGemm = void (*)(int, int, int, int, int, int, T, const T*, int, const T*, int, T, T*,
                           int);

template <typename T>
void RowMajorGemm(CblasGemm<T> gemm, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // An empty sum: BLAS may reject the call, so scale C here.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  const int ilda = static_cast<int>(std::max<int64_t>(1, lda));
  const int ildb = static_cast<int>(std::max<int64_t>(1, ldb));
  const int ildc = static_cast<int>(std::max<int64_t>(1, ldc));
  gemm(kCblasRowMajor, trans_a ? kCblasTrans : kCblasNoTrans, trans_b ? kCblasTrans : kCblasNoTrans,
       static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), T(1), a, ilda, b, ildb, beta,
       c, ildc);
}

}  // namespace

#if TRAINSUP_SYSTEM_BLAS
template <>
void Gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  RowMajorGemm<float>(cblas_sgemm, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

template <>
void Gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  RowMajorGemm<double>(cblas_dgemm, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}
#endif

std::string BlasCoreName() {
  auto fn = Lookup<char* (*)()>("openblas_get_corename");
  return fn ? std::string(fn()) : std::string("unknown");
}

std::string BlasLibraryPath() {
#if !TRAINSUP_SYSTEM_BLAS
  return "LibTorch (at::mm; no system BLAS at build time)";
#else
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&cblas_sgemm), &info) != 0 && info.dli_fname != nullptr) {
    char resolved[4096];
    if (realpath(info.dli_fname, resolved) != nullptr) return resolved;
    return info.dli_fname;
  }
  return "unknown";
#endif
}

int BlasThreads() {
  auto fn = Lookup<int (*)()>("openblas_get_num_threads");
  return fn ? fn() : -1;
}

void SetBlasThreads(int n) {
  auto fn = Lookup<void (*)(int)>("openblas_set_num_threads");
  if (fn) fn(n);
}

namespace {
// The thread count is one setting for the whole process: guards on several
// threads share it, the first saving it and the last restoring it.
std::mutex g_guard_mu;
int g_guard_depth = 0;
int g_guard_saved = -1;
}  // namespace

BlasSingleThreadGuard::BlasSingleThreadGuard() {
  std::lock_guard<std::mutex> lock(g_guard_mu);
  if (g_guard_depth++ == 0) {
    g_guard_saved = BlasThreads();
    if (g_guard_saved > 1) SetBlasThreads(1);
  }
}

BlasSingleThreadGuard::~BlasSingleThreadGuard() {
  std::lock_guard<std::mutex> lock(g_guard_mu);
  if (--g_guard_depth == 0 && g_guard_saved > 1) SetBlasThreads(g_guard_saved);
}

void EnsureFastBlasKernels(int argc, char** argv) {
  (void)argc;
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* keep = std::getenv("TRAINSUP_KEEP_BLAS_CORETYPE");
  if (keep != nullptr && std::strcmp(keep, "1") == 0) return;
  if (BlasCoreName() != "Prescott") return;
  const char* core = nullptr;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    core = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    core = "Haswell";
  }
#endif
  if (core == nullptr) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  // The marker stops a loop should the library ignore the variable.
  setenv("TRAINSUP_KEEP_BLAS_CORETYPE", "1", 1);
  execv("/proc/self/exe", argv);
  // execv returned: carry on with the kernels we have.
}

}  // namespace trainsup::sparse
