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

torch::nn::ModuleList MinkUNetImpl::MakeLayer(const std::string& name, int64_t planes, int64_t blocks) {
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

SparseTensor MinkUNetImpl::RunLayer(torch::nn::ModuleList& layer, SparseTensor x, bool final_layer) {
  for (size_t i = 0; i < layer->size(); ++i) {
    auto* block = layer[i]->as<CheckpointableBlock>();
    // The network's last block runs right before the loss: its activations
    // are needed at the start of backward, so recomputing them would cost a
    // forward of the largest block and lower no peak. It always keeps them.
    x = (final_layer && i + 1 == layer->size()) ? block->ForwardImpl(x, nullptr) : block->forward(x);
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
  conv1 = register_module("conv1", ConvLayer(inplanes_, inplanes_, ConvOptions{2, 2, 1}));
  bn1 = register_module("bn1", BatchNormLayer(inplanes_, 1e-5, m));
  block1 = MakeLayer("block1", p[0], config.layers[0]);
  conv2 = register_module("conv2", ConvLayer(inplanes_, inplanes_, ConvOptions{2, 2, 1}));
  bn2 = register_module("bn2", BatchNormLayer(inplanes_, 1e-5, m));
  block2 = MakeLayer("block2", p[1], config.layers[1]);
  conv3 = register_module("conv3", ConvLayer(inplanes_, inplanes_, ConvOptions{2, 2, 1}));
  bn3 = register_module("bn3", BatchNormLayer(inplanes_, 1e-5, m));
  block3 = MakeLayer("block3", p[2], config.layers[2]);
  conv4 = register_module("conv4", ConvLayer(inplanes_, inplanes_, ConvOptions{2, 2, 1}));
  bn4 = register_module("bn4", BatchNormLayer(inplanes_, 1e-5, m));
  block4 = MakeLayer("block4", p[3], config.layers[3]);

  up4 = register_module("up4", UpStage(inplanes_, p[4], m));
  inplanes_ = p[4] + p[2] * e;
  block5 = MakeLayer("block5", p[4], config.layers[4]);
  up5 = register_module("up5", UpStage(inplanes_, p[5], m));
  inplanes_ = p[5] + p[1] * e;
  block6 = MakeLayer("block6", p[5], config.layers[5]);
  up6 = register_module("up6", UpStage(inplanes_, p[6], m));
  inplanes_ = p[6] + p[0] * e;
  block7 = MakeLayer("block7", p[6], config.layers[6]);
  up7 = register_module("up7", UpStage(inplanes_, p[7], m));
  inplanes_ = p[7] + config.init_dim;
  block8 = MakeLayer("block8", p[7], config.layers[7]);
  final = register_module("final", ConvLayer(p[7] * e, config.out_channels, ConvOptions{1, 1, 1}, /*bias=*/true));
}

SparseTensor MinkUNetImpl::forward(const SparseTensor& x) {
  TORCH_CHECK(x.channels() == config_.in_channels, "MinkUNet expects ", config_.in_channels,
              " input channels, got ", x.channels());
  SparseTensor out_p1 = ReluInPlace(bn0(conv0(x)));
  SparseTensor out = ReluInPlace(bn1(conv1(out_p1)));
  SparseTensor out_b1p2 = RunLayer(block1, out);
  out = ReluInPlace(bn2(conv2(out_b1p2)));
  SparseTensor out_b2p4 = RunLayer(block2, out);
  out = ReluInPlace(bn3(conv3(out_b2p4)));
  SparseTensor out_b3p8 = RunLayer(block3, out);
  out = ReluInPlace(bn4(conv4(out_b3p8)));
  out = RunLayer(block4, out);

  out = RunLayer(block5, up4->forward(out, &out_b3p8));
  out = RunLayer(block6, up5->forward(out, &out_b2p4));
  out = RunLayer(block7, up6->forward(out, &out_b1p2));
  out = RunLayer(block8, up7->forward(out, &out_p1), /*final_layer=*/true);
  return final(out);
}

int64_t MinkUNetImpl::NumParameters() const {
  int64_t n = 0;
  for (const auto& t : parameters()) n += t.numel();
  return n;
}

}  // namespace trainsup::sparse
