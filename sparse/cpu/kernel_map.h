// The CPU backend's kernel-map builder: merges of sorted key lists on the
// host, parallel over chunks of output rows. Internal to sparse/.
#ifndef TRAINSUP_SPARSE_CPU_KERNEL_MAP_H_
#define TRAINSUP_SPARSE_CPU_KERNEL_MAP_H_

#include "sparse/backend.h"

namespace trainsup::sparse::cpu {

// Backend::build_kernel_map for inputs.device on the CPU: fills map->begin,
// in_rows and out_rows from the host keys of inputs.in and inputs.out.
void BuildKernelMap(const KernelMapInputs& inputs, KernelMap* map);

}  // namespace trainsup::sparse::cpu

#endif  // TRAINSUP_SPARSE_CPU_KERNEL_MAP_H_
