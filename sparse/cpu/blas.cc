#include "sparse/cpu/blas.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <cstring>

// Without a system BLAS (TRAINSUP_SYSTEM_BLAS=0: LibTorch wheels bring
// their own, not exported), Gemm is blas_aten.cc's.
#if TRAINSUP_SYSTEM_BLAS
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b,
            const int* ldb, const double* beta, double* c, const int* ldc);
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

template <typename T>
using FortranGemm = void (*)(const char*, const char*, const int*, const int*, const int*,
                             const T*, const T*, const int*, const T*, const int*, const T*, T*,
                             const int*);

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: call the
// Fortran routine with the operands swapped.
template <typename T>
void RowMajorGemm(FortranGemm<T> gemm, bool trans_a, bool trans_b, int64_t m, int64_t n,
                  int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c,
                  int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // An empty sum: BLAS may reject the call, so scale C here.
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
  const int ilda = static_cast<int>(std::max<int64_t>(1, lda));
  const int ildb = static_cast<int>(std::max<int64_t>(1, ldb));
  const int ildc = static_cast<int>(std::max<int64_t>(1, ldc));
  const T alpha = T(1);
  gemm(&tb, &ta, &in, &im, &ik, &alpha, b, &ildb, a, &ilda, &beta, c, &ildc);
}

}  // namespace

#if TRAINSUP_SYSTEM_BLAS
template <>
void Gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  RowMajorGemm<float>(sgemm_, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

template <>
void Gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                  int64_t ldc) {
  RowMajorGemm<double>(dgemm_, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
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
  if (dladdr(reinterpret_cast<void*>(&sgemm_), &info) != 0 && info.dli_fname != nullptr) {
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
