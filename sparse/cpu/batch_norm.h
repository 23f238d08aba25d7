// BatchNorm over the rows of a [N, C] feature matrix, optionally followed
// by ReLU, as one autograd function. Internal to sparse/ (ops.h's
// BatchNorm is the public entry point).
#ifndef TRAINSUP_SPARSE_CPU_BATCH_NORM_H_
#define TRAINSUP_SPARSE_CPU_BATCH_NORM_H_

#include <ATen/ATen.h>

namespace trainsup::sparse {

// Training mode (batch statistics; running statistics, when defined, are
// updated in place as at::batch_norm does: momentum-weighted, unbiased
// variance). weight and bias may be undefined (1 and 0). Statistics and
// gradient sums run over fixed blocks of rows, combined in block order, so
// results do not depend on the thread count. Two passes over the rows
// forward, two backward, where at::batch_norm with a separate ReLU takes
// about twice as many.
at::Tensor BatchNormTrainingRows(const at::Tensor& features, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& running_mean,
                                 const at::Tensor& running_var, double momentum, double eps,
                                 bool relu);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_CPU_BATCH_NORM_H_
