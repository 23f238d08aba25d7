// Modules over the engine's ops (torch::nn::Module subclasses), the
// ResNet-style sparse blocks, and gradient checkpointing per block.
#ifndef TRAINSUP_SPARSE_NN_H_
#define TRAINSUP_SPARSE_NN_H_

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "sparse/ops.h"
#include "sparse/sparse_tensor.h"

namespace trainsup::sparse {

// Weights [K^3, C_in, C_out], optional bias, initialised as MinkowskiEngine's
// ResNets do: Kaiming normal, fan-out mode, for ReLU (std sqrt(2 / (K^3 C_out))).
class ConvLayerImpl : public torch::nn::Module {
 public:
  ConvLayerImpl(int64_t in_channels, int64_t out_channels, ConvOptions options, bool bias = false,
                bool transposed = false);
  // Transposed convolutions go onto `target` (default: the set x was
  // downsampled from).
  SparseTensor forward(const SparseTensor& x, const SparseTensor* target = nullptr);
  const ConvOptions& options() const { return options_; }

  at::Tensor weight;
  at::Tensor bias;  // undefined without bias

 private:
  ConvOptions options_;
  bool transposed_;
};
TORCH_MODULE(ConvLayer);

// Sums a tensor over every process of a data-parallel gang, in place (a
// collective: every process calls it the same number of times, in the
// same order). Supplied by the worker (worker/gang/distributed.h), so the
// engine needs no communication library.
using StatsAllreduce = std::function<void(at::Tensor&)>;

// BatchNorm over the features. momentum: nullopt for a cumulative moving
// average (PyTorch's momentum=None); num_batches_tracked counts training
// forwards.
class BatchNormLayerImpl : public torch::nn::Module {
 public:
  explicit BatchNormLayerImpl(int64_t channels, double eps = 1e-5,
                              std::optional<double> momentum = 0.1,
                              bool track_running_stats = true);
  // relu: ReLU on the result, fused with the normalisation (ops.h).
  SparseTensor forward(const SparseTensor& x, bool relu = false);

  at::Tensor weight, bias;
  at::Tensor running_mean, running_var, num_batches_tracked;  // undefined without tracking

  // The moments of the rows this layer normalised in training (float64):
  // mean and sum of squared deviations per channel, and the row count.
  // Combined across pieces with Chan's parallel formula (the law of total
  // variance), so the moments of a batch run in pieces are the batch's.
  struct Moments {
    double rows = 0;
    at::Tensor mean, m2;
    void Add(double n, const at::Tensor& piece_mean, const at::Tensor& piece_m2);
    void Add(const Moments& other) {
      if (other.rows > 0) Add(other.rows, other.mean, other.m2);
    }
  };
  // Where a BatchNormStepStats collects this layer's moments; null: each
  // training forward moves the running statistics itself.
  struct Deferred {
    Moments piece, step;
  };

  // Set: training-mode statistics are those of every process's batch
  // together (PyTorch's SyncBatchNorm): the per-channel sums, sums of
  // squares and row count are allreduced in forward, and the sums of the
  // gradient and of gradient times normalised input in backward; the weight
  // and bias gradients stay this process's share. Empty: this batch only.
  void SetStatsAllreduce(StatsAllreduce allreduce) {
    allreduce_ = std::make_shared<StatsAllreduce>(std::move(allreduce));
    if (!*allreduce_) allreduce_.reset();
  }

  // BatchNormStepStats: while `deferred` is set, training forwards record
  // their moments in it and leave the running statistics alone; ApplyStep
  // moves them once from the step's moments.
  void SetDeferred(std::shared_ptr<Deferred> deferred) { deferred_ = std::move(deferred); }
  void ApplyStep(const Moments& step);

 private:
  SparseTensor ForwardDeferred(const SparseTensor& x, bool relu);

  double eps_;
  std::optional<double> momentum_;
  std::shared_ptr<StatsAllreduce> allreduce_;
  std::shared_ptr<Deferred> deferred_;
};
TORCH_MODULE(BatchNormLayer);

// BatchNorm running statistics moved once per optimizer step, however many
// pieces the step's batch ran in (worker/split/step.h). While this object
// lives, every tracking BatchNormLayer of `model` records the moments of the
// rows it normalises in training instead of moving its running statistics:
// a piece's into a pending set that CommitPiece adds to the step's, and
// that BeginPiece (or the next piece) discards, so a piece that fails (an
// out-of-memory error in its forward or backward) leaves no trace. ApplyStep
// moves each layer's running mean and variance once, with its momentum,
// from the combined moments: for the rows a layer saw, exactly the mean and
// unbiased variance of the whole batch (the normalisation itself still uses
// each piece's own statistics, as ghost batch norm does). With a statistics
// allreduce (SyncBatchNorm) the moments are the gang's. num_batches_tracked
// counts steps in which the layer saw a row. The recomputation of a
// checkpointed block records nothing. Detaches from the layers when
// destroyed; moments not applied are dropped.
class BatchNormStepStats {
 public:
  explicit BatchNormStepStats(torch::nn::Module& model);
  ~BatchNormStepStats();
  BatchNormStepStats(const BatchNormStepStats&) = delete;
  BatchNormStepStats& operator=(const BatchNormStepStats&) = delete;

  void BeginPiece();
  void CommitPiece();
  // Moves the running statistics and clears the step's moments.
  void ApplyStep();
  int64_t layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  std::vector<std::pair<BatchNormLayerImpl*, std::shared_ptr<BatchNormLayerImpl::Deferred>>>
      layers_;
};

// Training-mode BatchNorm over rows whose statistics are summed across
// processes by `allreduce` (see BatchNormLayerImpl::SetStatsAllreduce),
// then ReLU if `relu`. Sums in float64. `allreduce` must outlive the
// backward pass. `rows`, when set, receives the gang's row count.
at::Tensor SyncBatchNormTraining(const at::Tensor& features, const at::Tensor& weight,
                                 const at::Tensor& bias, const at::Tensor& running_mean,
                                 const at::Tensor& running_var, double momentum, double eps,
                                 bool relu, const StatsAllreduce* allreduce,
                                 double* rows = nullptr);

// Sets (or, with an empty function, clears) the statistics allreduce of
// every BatchNormLayer in `model`; returns how many there are.
int64_t SetBatchNormAllreduce(torch::nn::Module& model, const StatsAllreduce& allreduce);

// A block that can be a gradient-checkpoint boundary: with checkpointing on,
// in training mode and with gradients enabled, its forward keeps only its
// input; backward runs the block again (reusing the coordinate manager's
// kernel maps) and backpropagates through that. BatchNorm running statistics
// inside the block are updated once, by the first forward: they are
// snapshotted before the recomputation and restored after it, also when it
// throws. The CPU generator's state is replayed so recomputed dropout
// matches.
class CheckpointableBlock : public torch::nn::Module {
 public:
  // `skip`: the second input of a block that takes two (a decoder stage's
  // skip connection); null for the others.
  SparseTensor forward(const SparseTensor& x, const SparseTensor* skip = nullptr);
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  bool gradient_checkpointing() const { return checkpointing_; }
  // The block's computation.
  virtual SparseTensor ForwardImpl(const SparseTensor& x, const SparseTensor* skip) = 0;

 private:
  bool checkpointing_ = false;
};

// A block whose output is ReLU(body + input), the input projected by a 1x1
// conv + BN when the channels or the stride change.
class ResidualBlock : public CheckpointableBlock {
 public:
  ConvLayer downsample_conv{nullptr};  // empty without a projection
  BatchNormLayer downsample_norm{nullptr};

 protected:
  // Registers the projection if in_channels != out_channels or stride != 1.
  void InitProjection(int64_t in_channels, int64_t out_channels, int32_t stride,
                      double bn_momentum);
  // ReLU(body + projected x), in place on the fresh sum.
  SparseTensor AddResidual(const SparseTensor& body, const SparseTensor& x);
};

// conv3-BN-ReLU-conv3-BN, plus the input, then ReLU. expansion 1.
class BasicBlockImpl : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t in_channels, int64_t planes, int32_t stride = 1, int32_t dilation = 1,
                 double bn_momentum = 0.1);
  SparseTensor ForwardImpl(const SparseTensor& x, const SparseTensor* skip) override;

  ConvLayer conv1{nullptr}, conv2{nullptr};
  BatchNormLayer norm1{nullptr}, norm2{nullptr};
};
TORCH_MODULE(BasicBlock);

// conv1-BN-ReLU-conv3-BN-ReLU-conv1(x4)-BN, plus the input, then ReLU.
// expansion 4.
class BottleneckBlockImpl : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckBlockImpl(int64_t in_channels, int64_t planes, int32_t stride = 1, int32_t dilation = 1,
                      double bn_momentum = 0.1);
  SparseTensor ForwardImpl(const SparseTensor& x, const SparseTensor* skip) override;

  ConvLayer conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  BatchNormLayer norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
};
TORCH_MODULE(BottleneckBlock);

// A U-Net decoder stage: transposed convolution (2^3, stride 2) onto the
// skip's coordinates, BN, ReLU, then the skip's features concatenated. A
// checkpoint boundary too: with checkpointing on it keeps only the coarse
// input (the skip is kept by its producer anyway).
class UpStageImpl : public CheckpointableBlock {
 public:
  UpStageImpl(int64_t in_channels, int64_t out_channels, double bn_momentum = 0.1);
  SparseTensor ForwardImpl(const SparseTensor& x, const SparseTensor* skip) override;

  ConvLayer conv{nullptr};
  BatchNormLayer norm{nullptr};
};
TORCH_MODULE(UpStage);

// Walks the module tree and switches every checkpoint boundary; returns how
// many it switched. With `strict`, a model without any boundary is an
// error (c10::Error).
int64_t EnableGradientCheckpointing(torch::nn::Module& model, bool strict = true);
int64_t DisableGradientCheckpointing(torch::nn::Module& model);
bool IsGradientCheckpointing(const torch::nn::Module& model);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_NN_H_
