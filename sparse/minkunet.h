// MinkUNet: the segmentation U-Nets of MinkowskiEngine's examples
// (examples/minkunet.py) on our engine. A stem (5^3 conv), four stride-2
// encoder stages (2^3 conv + blocks), four decoder stages (2^3 transposed
// conv onto the skip's coordinates, BN, ReLU, concatenation: an UpStage;
// then blocks) and a final 1^3 classifier with bias. Blocks and UpStages are
// the gradient-checkpoint boundaries. Channel plan (32, 64, 128, 256, 256, 128, 96, 96),
// stem width 32.
#ifndef TRAINSUP_SPARSE_MINKUNET_H_
#define TRAINSUP_SPARSE_MINKUNET_H_

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
  ConvLayer conv0{nullptr}, conv1{nullptr}, conv2{nullptr}, conv3{nullptr}, conv4{nullptr};
  BatchNormLayer bn0{nullptr}, bn1{nullptr}, bn2{nullptr}, bn3{nullptr}, bn4{nullptr};
  UpStage up4{nullptr}, up5{nullptr}, up6{nullptr}, up7{nullptr};
  torch::nn::ModuleList block1{nullptr}, block2{nullptr}, block3{nullptr}, block4{nullptr};
  torch::nn::ModuleList block5{nullptr}, block6{nullptr}, block7{nullptr}, block8{nullptr};
  ConvLayer final{nullptr};
};
TORCH_MODULE(MinkUNet);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_MINKUNET_H_
