// Gemm for builds without a system BLAS (the LibTorch of a Python wheel
// links its BLAS statically and does not export sgemm_): the same row-major
// product through at::mm on the callers' buffers.
#include <ATen/ATen.h>

#include "sparse/cpu/blas.h"

namespace trainsup::sparse {
namespace {

// Row-major views of the callers' buffers; op(A) is m x k, op(B) k x n.
template <typename T>
void AtenGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
              const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const at::TensorOptions o = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto view = [&](const T* p, int64_t rows, int64_t cols, int64_t ld) {
    return at::from_blob(const_cast<T*>(p), {rows, cols}, {ld, 1}, o);
  };
  const at::Tensor A = trans_a ? view(a, k, m, lda).t() : view(a, m, k, lda);
  const at::Tensor B = trans_b ? view(b, n, k, ldb).t() : view(b, k, n, ldb);
  at::Tensor C = view(c, m, n, ldc);
  if (beta == T(0)) {
    at::mm_out(C, A, B);
  } else {
    C.mul_(beta).add_(at::mm(A, B));
  }
}

}  // namespace

template <>
void Gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  AtenGemm<float>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

template <>
void Gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  AtenGemm<double>(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace trainsup::sparse
