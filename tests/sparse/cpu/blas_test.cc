// The engine's BLAS seam (sparse/cpu/blas.h): Gemm against a plain loop for
// every transpose, and where the build linked a system BLAS, that Gemm's
// entry point resolves into it. The torch wheel's libtorch_cpu exports MKL's
// Fortran sgemm_/dgemm_ too, so a product bound by those names could land in
// either library depending on load order (docs/building.md, "Link hazards").
#include "sparse/cpu/blas.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace trainsup::sparse {
namespace {

template <typename T>
void CheckAgainstLoop(bool trans_a, bool trans_b) {
  const int64_t m = 7, n = 5, k = 9;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  // A is m x k (stored k x m when transposed), B is k x n (n x k).
  std::vector<T> a(m * k), b(k * n), c(m * n), expected(m * n);
  for (T& v : a) v = static_cast<T>(u(rng));
  for (T& v : b) v = static_cast<T>(u(rng));
  for (T& v : c) v = static_cast<T>(u(rng));
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const T beta = T(0.5);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const T aip = trans_a ? a[p * lda + i] : a[i * lda + p];
        const T bpj = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += static_cast<double>(aip) * bpj;
      }
      expected[i * n + j] = static_cast<T>(sum + beta * c[i * n + j]);
    }
  }
  Gemm<T>(trans_a, trans_b, m, n, k, a.data(), lda, b.data(), ldb, beta, c.data(), n);
  for (int64_t i = 0; i < m * n; ++i) {
    EXPECT_NEAR(c[i], expected[i], 1e-4)
        << "element " << i << ", trans_a " << trans_a << ", trans_b " << trans_b;
  }
}

TEST(Blas, GemmMatchesALoopForEveryTranspose) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckAgainstLoop<float>(ta, tb);
      CheckAgainstLoop<double>(ta, tb);
    }
  }
}

TEST(Blas, ProductsResolveIntoTheSystemBlasNotLibTorch) {
  const std::string path = BlasLibraryPath();
  if (path.rfind("LibTorch", 0) == 0) GTEST_SKIP() << "built without a system BLAS: " << path;
  EXPECT_NE(path.find("openblas"), std::string::npos) << path;
  EXPECT_EQ(path.find("torch"), std::string::npos) << path;
  EXPECT_NE(BlasCoreName(), "unknown");
}

}  // namespace
}  // namespace trainsup::sparse
