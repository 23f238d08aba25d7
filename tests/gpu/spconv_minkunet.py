#!/usr/bin/env python3
"""The anchor of issue 45's comparison: trainsup's MinkUNet14 rebuilt in
spconv 2.x, timed on the same scene as minkunet_bench.

The network is sparse/minkunet.cc's plan, layer for layer:
  stem     SubMConv3d 5^3 (3 -> 32), BatchNorm, ReLU
  4 x      SparseConv3d 2^3 stride 2 (c -> c), BatchNorm, ReLU, then one
           BasicBlock (SubMConv3d 3^3, BN, ReLU, SubMConv3d 3^3, BN, plus
           the input through a 1x1 SubMConv3d and BN where the channels
           change, ReLU), planes 32, 64, 128, 256
  4 x      SparseInverseConv3d 2^3 (c -> p), BatchNorm, ReLU, concatenated
           with the encoder's skip (same voxels, same order), then one
           BasicBlock, planes 256, 128, 96, 96
  final    a 1x1 convolution with bias (nn.Linear on the features)
No convolution but the final one has a bias, as in trainsup.

The scene comes from `minkunet_bench --dump-scene FILE` (voxel
coordinates [N, 4] int32 as batch, x, y, z; features [N, 3]; labels [N]),
so both engines see the same voxels, features and batch.

Timed, as medians of --repeats after --warmup untimed runs (spconv tunes
its kernels at first use; that warm-up stays out of the medians and is
printed apart):
  forward      no gradients, BatchNorm in eval mode (as minkunet_bench's),
               indices rebuilt (spconv always rebuilds them)
  step         forward, cross-entropy, backward, with the device synchronised
For each mode of --tf32 (spconv.constants.SPCONV_ALLOW_TF32 and torch's
switches). Give one mode per process where the figures count: spconv's
tuners cache their choice without the TF32 switch in the key, so a second
mode in the same process reuses the first one's kernels
(tests/gpu/bench_vs_spconv.sh runs one process each). Prints one JSON
object on stdout, alone: what spconv prints there goes to stderr.

Usage: spconv_minkunet.py --scene FILE [--device cuda|cpu] [--repeats 5]
                          [--warmup 3] [--tf32 off,on]
(--device cpu with the CPU wheel `spconv` 2.3.8 is how it was checked on a
machine without a GPU: docs/benchmarks.md.)
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

# Not `spconv.constants` after the next import: that name is then
# spconv.pytorch.constants, another module, and setting the TF32 switch
# on it would change nothing.
import spconv.constants as spconv_constants
import spconv.pytorch as spconv

PLANES = (32, 64, 128, 256, 256, 128, 96, 96)
INIT_DIM = 32


def bn_relu(c):
    return [nn.BatchNorm1d(c, eps=1e-5, momentum=0.1), nn.ReLU()]


class BasicBlock(spconv.SparseModule):
    def __init__(self, cin, planes, key):
        super().__init__()
        self.body = spconv.SparseSequential(
            spconv.SubMConv3d(cin, planes, 3, bias=False, indice_key=key),
            *bn_relu(planes),
            spconv.SubMConv3d(planes, planes, 3, bias=False, indice_key=key),
            nn.BatchNorm1d(planes, eps=1e-5, momentum=0.1))
        self.down = None
        if cin != planes:
            self.down = spconv.SparseSequential(
                spconv.SubMConv3d(cin, planes, 1, bias=False, indice_key=key + "_1x1"),
                nn.BatchNorm1d(planes, eps=1e-5, momentum=0.1))

    def forward(self, x):
        out = self.body(x)
        residual = self.down(x) if self.down is not None else x
        return out.replace_feature(torch.relu(out.features + residual.features))


class MinkUNet14(nn.Module):
    def __init__(self, in_channels=3, out_channels=20):
        super().__init__()
        self.stem = spconv.SparseSequential(
            spconv.SubMConv3d(in_channels, INIT_DIM, 5, bias=False, indice_key="stem"),
            *bn_relu(INIT_DIM))
        c = INIT_DIM
        self.down, self.enc = nn.ModuleList(), nn.ModuleList()
        for i in range(4):
            self.down.append(spconv.SparseSequential(
                spconv.SparseConv3d(c, c, 2, stride=2, bias=False, indice_key="down%d" % i),
                *bn_relu(c)))
            self.enc.append(BasicBlock(c, PLANES[i], "subm%d" % (i + 1)))
            c = PLANES[i]
        skips = (PLANES[2], PLANES[1], PLANES[0], INIT_DIM)
        self.up, self.dec = nn.ModuleList(), nn.ModuleList()
        for i in range(4):
            p = PLANES[4 + i]
            self.up.append(spconv.SparseSequential(
                spconv.SparseInverseConv3d(c, p, 2, bias=False, indice_key="down%d" % (3 - i)),
                *bn_relu(p)))
            self.dec.append(BasicBlock(p + skips[i], p, "subm%d" % (3 - i)))
            c = p
        self.final = nn.Linear(c, out_channels)

    def forward(self, x):
        out = self.stem(x)
        skips = []
        for i in range(4):
            skips.append(out)
            out = self.enc[i](self.down[i](out))
        for i in range(4):
            up = self.up[i](out)
            skip = skips[3 - i]
            out = self.dec[i](up.replace_feature(torch.cat([up.features, skip.features], 1)))
        return self.final(out.features)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scene", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tf32", default="off,on")
    a = ap.parse_args()
    # The JSON alone on stdout: spconv prints notes there (from Python and
    # from its C++), so fd 1 becomes stderr and the JSON goes to a copy.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    device = torch.device(a.device)
    if device.type == "cpu":
        # spconv's backward asks torch for the current CUDA stream even for
        # CPU tensors, which a CUDA build of torch refuses without a
        # driver; on the CPU there is no stream to give (0).
        import spconv.pytorch.cppcore as cppcore
        import spconv.pytorch.ops as ops
        cppcore.get_current_stream = lambda: 0
        if hasattr(ops, "get_current_stream"):
            ops.get_current_stream = lambda: 0
    scene = torch.load(a.scene, weights_only=True)
    coords, features, labels = scene[0], scene[1], scene[2]
    # spconv's indices are (batch, z, y, x) within spatial_shape; trainsup's
    # coordinates are (batch, x, y, z), any integers: shifted to start at 0.
    xyz = coords[:, 1:].to(torch.int64)
    xyz = xyz - xyz.min(0).values
    # A multiple of 16 on each axis: with an odd size, each of the four
    # stride-2 convolutions (output size floor(s / 2)) would drop the
    # voxels on the top edge, and spconv would do less work than ours.
    shape = [(int(v) + 1 + 15) // 16 * 16 for v in xyz.max(0).values.flip(0)]
    indices = torch.cat([coords[:, :1].to(torch.int64), xyz.flip(1)], 1).to(torch.int32)
    indices, features, labels = indices.to(device), features.to(device), labels.to(device)
    torch.manual_seed(0)
    net = MinkUNet14(features.shape[1], 20).to(device)
    result = {"engine": "spconv", "spconv": getattr(sys.modules["spconv"], "__version__", "?"),
              "torch": torch.__version__, "device": str(device), "voxels": int(indices.shape[0]),
              "spatial_shape": shape, "parameters": sum(p.numel() for p in net.parameters())}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)

    def tensor():
        return spconv.SparseConvTensor(features, indices, shape, 1)

    def forward():
        net.eval()
        with torch.no_grad():
            net(tensor())
        net.train()

    def step():
        net.zero_grad(set_to_none=True)
        logits = net(tensor())
        nn.functional.cross_entropy(logits.float(), labels).backward()

    net.train()
    for mode in a.tf32.split(","):
        on = mode == "on"
        spconv_constants.SPCONV_ALLOW_TF32 = on
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        first = [timed(step, device) for _ in range(a.warmup)]
        steps = [timed(step, device) for _ in range(a.repeats)]
        forwards = [timed(forward, device) for _ in range(a.repeats)]
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        result["tf32_" + mode] = {"warmup_steps_s": first, "step_s": statistics.median(steps),
                                  "forward_s": statistics.median(forwards),
                                  "steps_s": steps, "peak_bytes": peak}
        print("spconv MinkUNet14 TF32 %s: step %.4f s, forward %.4f s (medians of %d; warm-up "
              "steps %s)" % (mode, statistics.median(steps), statistics.median(forwards),
                             a.repeats, ", ".join("%.3f" % t for t in first)), file=sys.stderr)
    json_out.write(json.dumps(result) + "\n")
    json_out.flush()


if __name__ == "__main__":
    main()
