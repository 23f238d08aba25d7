#include "sparse/minkunet.h"

#include <torch/torch.h>

namespace trainsup::sparse {

std::string ToString(BlockType type) { return type == BlockType::kBasic ? "basic" : "bottleneck"; }

MinkUNetConfig MinkUNetPlan(int depth, int64_t in_channels, int64_t out_channels) {
  MinkUNetConfig c;
  c.in_channels = in_channels;
  c.out_channels = out_channels;
  switch (depth) {
    case 14:
      c.layers = {1, 1, 1, 1, 1, 1, 1, 1};
      break;
    case 18:
      c.layers = {2, 2, 2, 2, 2, 2, 2, 2};
      break;
    case 34:
      c.layers = {2, 3, 4, 6, 2, 2, 2, 2};
      break;
    case 50:
      c.block = BlockType::kBottleneck;
      c.layers = {2, 3, 4, 6, 2, 2, 2, 2};
      break;
    default:
      TORCH_CHECK(false, "MinkUNet", depth, " is not a known plan (14, 18, 34 or 50)");
  }
  return c;
}

namespace {
int64_t Expansion(BlockType t) {
  return t == BlockType::kBasic ? BasicBlockImpl::kExpansion : BottleneckBlockImpl::kExpansion;
}
}  // namespace

torch::nn::ModuleList MinkUNetImpl::MakeLayer(const std::string& name, int64_t planes,
                                              int64_t blocks) {
  torch::nn::ModuleList layer;
  for (int64_t i = 0; i < blocks; ++i) {
    if (config_.block == BlockType::kBasic) {
      layer->push_back(BasicBlock(inplanes_, planes, 1, 1, config_.bn_momentum));
    } else {
      layer->push_back(BottleneckBlock(inplanes_, planes, 1, 1, config_.bn_momentum));
    }
    inplanes_ = planes * Expansion(config_.block);
  }
  return register_module(name, layer);
}

SparseTensor MinkUNetImpl::RunLayer(torch::nn::ModuleList& layer, SparseTensor x,
                                    bool final_layer) {
  for (size_t i = 0; i < layer->size(); ++i) {
    auto* block = layer[i]->as<CheckpointableBlock>();
    // The network's last block runs right before the loss: its activations
    // are needed at the start of backward, so recomputing them would cost a
    // forward of the largest block and lower no peak. It always keeps them.
    x = (final_layer && i + 1 == layer->size()) ? block->ForwardImpl(x, nullptr)
                                                : block->forward(x);
  }
  return x;
}

MinkUNetImpl::MinkUNetImpl(const MinkUNetConfig& config) : config_(config) {
  const auto& p = config.planes;
  const int64_t e = Expansion(config.block);
  const double m = config.bn_momentum;
  inplanes_ = config.init_dim;
  conv0 = register_module("conv0", ConvLayer(config.in_channels, inplanes_, ConvOptions{5, 1, 1}));
  bn0 = register_module("bn0", BatchNormLayer(inplanes_, 1e-5, m));
  for (int i = 0; i < 4; ++i) {
    const std::string n = std::to_string(i + 1);
    down_conv[i] =
        register_module("conv" + n, ConvLayer(inplanes_, inplanes_, ConvOptions{2, 2, 1}));
    down_bn[i] = register_module("bn" + n, BatchNormLayer(inplanes_, 1e-5, m));
    blocks[i] = MakeLayer("block" + n, p[i], config.layers[i]);
  }
  // Channels of the skips the decoder stages concatenate, deepest first.
  const int64_t skip_channels[4] = {p[2] * e, p[1] * e, p[0] * e, config.init_dim};
  for (int i = 0; i < 4; ++i) {
    up[i] = register_module("up" + std::to_string(i + 4), UpStage(inplanes_, p[4 + i], m));
    inplanes_ = p[4 + i] + skip_channels[i];
    blocks[4 + i] = MakeLayer("block" + std::to_string(i + 5), p[4 + i], config.layers[4 + i]);
  }
  final = register_module(
      "final", ConvLayer(p[7] * e, config.out_channels, ConvOptions{1, 1, 1}, /*bias=*/true));
}

SparseTensor MinkUNetImpl::forward(const SparseTensor& x) {
  TORCH_CHECK(x.channels() == config_.in_channels, "MinkUNet expects ", config_.in_channels,
              " input channels, got ", x.channels());
  // skips[i]: the input of encoder stage i (stem output, then each stage's).
  std::array<SparseTensor, 4> skips;
  SparseTensor out = bn0(conv0(x), /*relu=*/true);
  for (int i = 0; i < 4; ++i) {
    skips[i] = out;
    out = RunLayer(blocks[i], down_bn[i](down_conv[i](out), /*relu=*/true));
  }
  for (int i = 0; i < 4; ++i) {
    out = RunLayer(blocks[4 + i], up[i]->forward(out, &skips[3 - i]), /*final_layer=*/i == 3);
  }
  return final(out);
}

int64_t MinkUNetImpl::NumParameters() const {
  int64_t n = 0;
  for (const auto& t : parameters()) n += t.numel();
  return n;
}

}  // namespace trainsup::sparse
