#!/usr/bin/env bash
# Issue 45's side-by-side: trainsup's MinkUNet14 on the cuda backend
# against the same network in spconv 2.3.8 (tests/gpu/spconv_minkunet.py),
# on the same GPU, the same voxels, features and batch, in one call.
#
#   tests/gpu/bench_vs_spconv.sh --prepare   here, first: downloads the
#       wheels the GPU machine lacks (spconv-cu126 2.3.8, cumm-cu126
#       0.7.11 and the small packages they import, for its Python 3.12),
#       unpacks them and packs them into .gpu/spconv-site.tar.xz (under 40
#       MB), which a device call carries (carry .gpu/spconv-site.tar.xz)
#   tests/gpu/run.sh; tests/gpu/bench_vs_spconv.sh   on the GPU machine, in
#       one call: run.sh builds build-gpu (minkunet_bench with the cuda
#       backend) and this script uses it
#
# On the GPU machine, for the default and the large scene:
#   1. minkunet_bench --dump-scene writes the voxelised scene;
#   2. minkunet_bench --device cuda --backend cuda, with TF32 off and on:
#      the forward without gradients (maps rebuilt, as spconv always does),
#      the training step with cached maps, and the first step (maps built
#      for the new scene; one sample);
#   3. spconv_minkunet.py on the same file: its forward and its step (which
#      rebuilds the maps every time), TF32 off and on, after three untimed
#      warm-up steps (spconv compiles or tunes kernels at first use: the
#      warm-up times are printed apart);
# then one JSON object on stdout with both engines' figures and our step
# over spconv's. Logs and raw results go to $OUT (or build-gpu/out).
# TRAINSUP_CUDA_DATAFLOW (gemm | fused | measured) passes through to ours.
#
# NEVER RUN ON A GPU so far. Its Python half (spconv_minkunet.py) has run
# on this machine's CPU with the CPU wheel of spconv 2.3.8: the same
# 11,580,852 parameters as trainsup's MinkUNet14, forward and backward.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pack="$root/.gpu/spconv-site.tar.xz"

if [[ ${1:-} == --prepare ]]; then
  tmp=$(mktemp -d /tmp/spconv_wheels.XXXXXX)
  trap 'rm -rf "$tmp"' EXIT
  # The device's Python is 3.12 (KINDS.md): wheels for it, not for this
  # machine's Python. What `import spconv.pytorch` loads: spconv, cumm,
  # pccm, ccimport, lark, pybind11, ninja, certifi (and numpy, which the
  # device's torch environment is expected to have; checked there).
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$tmp/wheels" \
    spconv-cu126==2.3.8 cumm-cu126==0.7.11 pccm ccimport lark pybind11 ninja certifi fire \
    termcolor portalocker >&2
  # A wheel installed with --target is its files: unzipped, then packed
  # with xz, which compresses the CUDA code far better than the wheels'
  # zip does (about 97 MB of wheels to under 40 MB).
  mkdir -p "$tmp/spconv-site"
  for w in "$tmp"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tmp/spconv-site"; done
  mkdir -p "$(dirname "$pack")"
  tar -C "$tmp" -cf - spconv-site | xz -9e -T1 >"$pack"
  echo "bench_vs_spconv: $(find "$tmp/wheels" -name "*.whl" | wc -l) wheels packed into $pack" \
    "($(du -h "$pack" | cut -f1)); carry .gpu" >&2
  exit 0
fi
[[ $# -eq 0 ]] || { echo "usage: $0 [--prepare]" >&2; exit 64; }

build="$root/build-gpu"
out=${OUT:-$build/out}
mkdir -p "$out"
log="$out/bench_vs_spconv.log"
bench="$build/sparse/minkunet_bench"
[[ -x $bench ]] || { echo "no $bench: run tests/gpu/run.sh first (same call)" >&2; exit 1; }
[[ -f $pack ]] || { echo "no $pack: run --prepare here and carry .gpu" >&2; exit 1; }

site="$out/spconv-site"
rm -rf "$site"
tar -C "$out" -xJf "$pack"
python3 -c "import numpy" 2>>"$log" || { echo "the device's python3 has no numpy" >&2; exit 1; }

for scene in default large; do
  "$bench" --scene "$scene" --dump-scene "$out/scene_$scene.pt" 2>>"$log"
  for tf32 in off on; do
    "$bench" --device cuda --backend cuda --depths 14 --repeats 5 --json --scene "$scene" \
      --tf32 "$tf32" >"$out/ours_${scene}_tf32_$tf32.json" 2>>"$log" ||
      echo "{}" >"$out/ours_${scene}_tf32_$tf32.json"
  done
  PYTHONPATH="$site" python3 "$root/tests/gpu/spconv_minkunet.py" --scene "$out/scene_$scene.pt" \
    --device cuda --repeats 5 --warmup 3 >"$out/spconv_$scene.json" 2>>"$log" ||
    echo "{}" >"$out/spconv_$scene.json"
done

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
result = {}
for scene in ("default", "large"):
    sp = load("spconv_%s.json" % scene)
    r = {"spconv": sp}
    for tf32 in ("off", "on"):
        ours = load("ours_%s_tf32_%s.json" % (scene, tf32))
        theirs = sp.get("tf32_" + tf32, {})
        row = {"ours_forward_s": ours.get("minkunet14_forward_s"),
               "ours_step_cached_maps_s": ours.get("minkunet14_plain_step_s"),
               "ours_first_step_new_maps_s": ours.get("minkunet14_plain_first_step_s"),
               "spconv_forward_s": theirs.get("forward_s"),
               "spconv_step_s": theirs.get("step_s")}
        for a, b in (("ours_step_cached_maps_s", "spconv_step_s"),
                     ("ours_first_step_new_maps_s", "spconv_step_s"),
                     ("ours_forward_s", "spconv_forward_s")):
            if row[a] and row[b]:
                row[a[:-2] + "_over_spconv"] = row[a] / row[b]
        r["tf32_" + tf32] = row
    result[scene] = r
d, l = result["default"]["tf32_off"], result["large"]["tf32_off"]
if d.get("ours_step_cached_maps_s") and l.get("ours_step_cached_maps_s"):
    result["ours_large_over_default_step"] = l["ours_step_cached_maps_s"] / d["ours_step_cached_maps_s"]
print(json.dumps(result))
PY
