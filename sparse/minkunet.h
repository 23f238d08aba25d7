// MinkUNet: the segmentation U-Nets of MinkowskiEngine's examples
// (examples/minkunet.py) on our engine. A stem (5^3 conv), four stride-2
// encoder stages (2^3 conv + blocks), four decoder stages (2^3 transposed
// conv onto the skip's coordinates, BN, ReLU, concatenation: an UpStage;
// then blocks) and a final 1^3 classifier with bias. Blocks and UpStages are
// the gradient-checkpoint boundaries. Channel plan (32, 64, 128, 256, 256, 128, 96, 96),
// stem width 32.
#ifndef TRAINSUP_SPARSE_MINKUNET_H_
#define TRAINSUP_SPARSE_MINKUNET_H_

#include <torch/nn/modules/container/modulelist.h>

#include <array>
#include <string>

#include "sparse/nn.h"

namespace trainsup::sparse {

enum class BlockType { kBasic, kBottleneck };
std::string ToString(BlockType type);

struct MinkUNetConfig {
  BlockType block = BlockType::kBasic;
  std::array<int64_t, 8> layers = {1, 1, 1, 1, 1, 1, 1, 1};
  std::array<int64_t, 8> planes = {32, 64, 128, 256, 256, 128, 96, 96};
  int64_t init_dim = 32;
  int64_t in_channels = 3;
  int64_t out_channels = 20;
  double bn_momentum = 0.1;
};

// The reference plans: 14, 18, 34 (BasicBlock) and 50 (BottleneckBlock).
// Throws c10::Error for another depth.
MinkUNetConfig MinkUNetPlan(int depth, int64_t in_channels, int64_t out_channels);

// The tensor stride of the bottom of the U (four stride-2 stages).
constexpr int32_t kMinkUNetCoarsestStride = 16;

class MinkUNetImpl : public torch::nn::Module {
 public:
  explicit MinkUNetImpl(const MinkUNetConfig& config);
  // Per-voxel logits on the input's coordinates.
  SparseTensor forward(const SparseTensor& x);
  const MinkUNetConfig& config() const { return config_; }
  int64_t NumParameters() const;

 private:
  torch::nn::ModuleList MakeLayer(const std::string& name, int64_t planes, int64_t blocks);
  SparseTensor RunLayer(torch::nn::ModuleList& layer, SparseTensor x, bool final_layer = false);

  MinkUNetConfig config_;
  int64_t inplanes_ = 0;
  ConvLayer conv0{nullptr};  // the 5^3 stem
  BatchNormLayer bn0{nullptr};
  // Encoder stage i: 2^3 stride-2 conv (conv1..conv4), BN, blocks (block1..block4).
  std::array<ConvLayer, 4> down_conv{ConvLayer(nullptr), ConvLayer(nullptr), ConvLayer(nullptr),
                                     ConvLayer(nullptr)};
  std::array<BatchNormLayer, 4> down_bn{BatchNormLayer(nullptr), BatchNormLayer(nullptr),
                                        BatchNormLayer(nullptr), BatchNormLayer(nullptr)};
  // Decoder stage i: UpStage (up4..up7), then blocks (block5..block8).
  std::array<UpStage, 4> up{UpStage(nullptr), UpStage(nullptr), UpStage(nullptr), UpStage(nullptr)};
  std::array<torch::nn::ModuleList, 8> blocks;  // block1..block8
  ConvLayer final{nullptr};
};
TORCH_MODULE(MinkUNet);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_MINKUNET_H_
