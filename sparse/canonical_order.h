// Internal to sparse/: runs a row-wise function over features in coordinate
// key order when deterministic mode is on, so reductions over rows see one
// order whatever the input's row order.
#ifndef TRAINSUP_SPARSE_CANONICAL_ORDER_H_
#define TRAINSUP_SPARSE_CANONICAL_ORDER_H_

#include <ATen/ATen.h>

#include "sparse/determinism.h"
#include "sparse/sparse_tensor.h"

namespace trainsup::sparse {

// fn maps N x C rows to N x C' rows, row i of the result belonging to row i
// of its argument. Returns fn(x.F()) with rows in x's order.
template <typename Fn>
at::Tensor InCanonicalOrder(const SparseTensor& x, Fn fn) {
  const CoordinateSet& set = x.manager()->Meta(x.set_id());
  if (!IsDeterministic() || set.sorted) return fn(x.F());
  const DeviceCoordinates& d = x.manager()->OnDevice(x.set_id(), x.F().device());
  return fn(x.F().index_select(0, d.order)).index_select(0, d.rank);
}

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_CANONICAL_ORDER_H_
