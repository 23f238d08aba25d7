// What a program on the engine sets up first thing in main(), through the
// engine's public headers rather than a backend's (the CPU backend
// implements these, sparse/cpu/blas.cc).
#ifndef TRAINSUP_SPARSE_RUNTIME_H_
#define TRAINSUP_SPARSE_RUNTIME_H_

#include <string>

namespace trainsup::sparse {

// OpenBLAS 0.3.21 does not recognise recent Xeons and falls back to its
// "Prescott" kernels, about 3x slower. OPENBLAS_CORETYPE is read only when
// the library loads, so a program calls this first thing in main(): when
// OpenBLAS fell back and the CPU supports AVX-512 (or AVX2+FMA), it sets
// OPENBLAS_CORETYPE to SkylakeX (or Haswell) and re-executes the program.
// Does nothing when OPENBLAS_CORETYPE is set already or
// TRAINSUP_KEEP_BLAS_CORETYPE=1. Returns only if no re-exec happened.
void EnsureFastBlasKernels(int argc, char** argv);

// OpenBLAS's kernel set ("SkylakeX", "Haswell", "Prescott", ...), or
// "unknown" when the BLAS is not OpenBLAS.
std::string BlasCoreName();

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_RUNTIME_H_
