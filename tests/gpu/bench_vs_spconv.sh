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
#   2. minkunet_bench --device cuda --backend cuda --checkpointing off,
#      with TF32 off and on: the forward without gradients (maps rebuilt,
#      as spconv always does), the training step with cached maps, and the
#      first step (maps built for the new scene; one sample);
#   3. spconv_minkunet.py on the same file, one process per TF32 mode (its
#      tuners' cache does not tell the modes apart): its forward and its
#      step (which rebuilds the maps every time), after three untimed
#      warm-up steps (spconv compiles or tunes kernels at first use: the
#      warm-up times are printed apart);
# then one JSON object on stdout with both engines' figures and our step
# over spconv's, printed whatever stops the script. DEADLINE (seconds,
# default 300) bounds it: each command gets the smaller of its cap and
# what is left. Logs and raw results go to build-gpu/bench_vs_spconv/;
# with $OUT set (the device tool, which returns at most 8 files), the JSON
# to $OUT/bench_vs_spconv.json and the rest packed into
# $OUT/bench_vs_spconv.tgz. spconv unpacked (360 MB) and the scenes go to a
# scratch folder under /tmp, removed at the end.
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
mode=gpu
if [[ ${1:-} == --cpu-only ]]; then
  mode=cpu
  shift
fi
[[ $# -eq 0 ]] || { echo "usage: $0 [--prepare | --cpu-only]" >&2; exit 64; }

if [[ $mode == gpu ]]; then
  build="$root/build-gpu"
  python=python3
  ours=(--device cuda --backend cuda --repeats 5)
  theirs=(--device cuda --repeats 5 --warmup 3)
  scenes=(default large)
  [[ -f $pack ]] || { echo "no $pack: run --prepare here and carry .gpu/spconv-site.tar.xz" >&2; exit 1; }
else
  # The plumbing, here: run.sh --cpu-only's build, the small scene once on
  # the CPU, and spconv's CPU wheel from SPCONV_SITE (pip install --target
  # DIR spconv==2.3.8), with the project's Python.
  build="$root/build-gpu-cpu-only"
  python=${TRAINSUP_VENV:-/opt/trainsup/venv}/bin/python3
  ours=(--device cpu --backend cpu --repeats 1)
  theirs=(--device cpu --repeats 1 --warmup 1)
  scenes=(small)
  [[ -d ${SPCONV_SITE:-} ]] || { echo "--cpu-only needs SPCONV_SITE: a folder with spconv 2.3.8's CPU wheel installed (pip install --target)" >&2; exit 1; }
fi
bench="$build/sparse/minkunet_bench"
[[ -x $bench ]] || { echo "no $bench: run tests/gpu/run.sh first (same call)" >&2; exit 1; }
# Results and logs in $out (packed into $OUT at the end: the device tool
# returns at most 8 files); spconv's 360 MB unpacked and the scenes in a
# scratch folder that nothing returns.
# One deadline for the whole script (default 300 s): each command gets the
# smaller of its cap and what is left, and the JSON is always printed.
# shellcheck source=tests/gpu/lib.sh
source "$root/tests/gpu/lib.sh"
gpu_begin bench_vs_spconv "$build/bench_vs_spconv" "${DEADLINE:-300}" 10
scratch=$(mktemp -d /tmp/bench_vs_spconv.XXXXXX)
# Runs "$@" with at most `cap` seconds (and what is left), its stdout into
# file; on failure the file holds {} and the log says why.
timed_json() {  # cap file command...
  local cap=$1 file=$2 limit status=0
  shift 2
  limit=$(left "$cap")
  if ((limit < 10)); then say "skipped, the deadline is near: $*"; echo "{}" >"$file"; return; fi
  timeout "$limit" "$@" >"$file" 2>>"$log" || status=$?
  if ((status != 0)); then say "exit $status: $*"; echo "{}" >"$file"; fi
}
summary() {
  local json
  json=$(python3 - "$out" "$(($(date +%s) - start))" "${scenes[@]}" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
result = {}
for scene in sys.argv[3:]:
    r = {}
    for tf32 in ("off", "on"):
        ours = load("ours_%s_tf32_%s.json" % (scene, tf32))
        sp = load("spconv_%s_tf32_%s.json" % (scene, tf32))
        theirs = sp.pop("tf32_" + tf32, {})
        r.setdefault("spconv", sp)
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
        r["spconv_tf32_" + tf32] = theirs
    result[scene] = r
d = result.get("default", {}).get("tf32_off", {})
l = result.get("large", {}).get("tf32_off", {})
if d.get("ours_step_cached_maps_s") and l.get("ours_step_cached_maps_s"):
    result["ours_large_over_default_step"] = l["ours_step_cached_maps_s"] / d["ours_step_cached_maps_s"]
result["total_s"] = int(sys.argv[2])
print(json.dumps(result))
PY
)
  publish "$json"
}
# Whatever ends the script, the JSON so far is printed and the scratch
# folder removed.
trap 'summary; rm -rf "$scratch"' EXIT

# run.sh's library path (the wheel's CUDA libraries) for its build.
[[ -f $build/env.sh ]] && source "$build/env.sh"
# spconv's kernels that the driver compiles at first use (its sm_61 and
# PTX fat binaries), kept for the later processes of this call.
export CUDA_CACHE_PATH="$scratch/cuda-cache" CUDA_CACHE_MAXSIZE=2147483648
site="$scratch/spconv-site"
if [[ $mode == cpu ]]; then
  site=$SPCONV_SITE
elif command -v xz >/dev/null; then
  say "unpacking $pack"
  tar -C "$scratch" -xJf "$pack"
else
  say "unpacking $pack (Python's xz: no xz command)"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
    "$pack" "$scratch"
fi
env PYTHONPATH="$site" "$python" -c "import numpy" 2>>"$log" ||
  { say "$python has no numpy"; exit 1; }

for scene in "${scenes[@]}"; do
  say "scene $scene: dump"
  if ! timeout "$(left 60)" "$bench" --scene "$scene" --dump-scene "$scratch/scene_$scene.pt" \
    2>>"$log"; then
    say "scene $scene: --dump-scene failed"
    continue
  fi
  for tf32 in off on; do
    say "scene $scene, TF32 $tf32: ours"
    timed_json 90 "$out/ours_${scene}_tf32_$tf32.json" "$bench" "${ours[@]}" \
      --depths 14 --json --checkpointing off --scene "$scene" --tf32 "$tf32"
    # One process per TF32 mode: spconv's tuners cache their choice
    # without the TF32 switch in the key.
    say "scene $scene, TF32 $tf32: spconv"
    timed_json 150 "$out/spconv_${scene}_tf32_$tf32.json" env PYTHONPATH="$site" \
      "$python" "$root/tests/gpu/spconv_minkunet.py" --scene "$scratch/scene_$scene.pt" \
      "${theirs[@]}" --tf32 "$tf32"
  done
done
say "done"
