#!/usr/bin/env bash
# Runs minkunet_bench --json on the scene presets from small to huge (one
# process each) and draws the plots of docs/benchmarks.md from the output:
#   bash docs/plots/run_minkunet_scaling.sh [BUILD_DIR] [OUT_DIR]
# Environment as for the benchmark (TRAINSUP_KERNELS, OPENBLAS_CORETYPE,
# OMP_WAIT_POLICY); REPEATS (default 3; large: LARGE_REPEATS, default 2;
# huge: HUGE_REPEATS, default 1); THREADS (default 2). Each benchmark runs
# under cpulock when there is one (the shared development machine).
# The huge scene (2.0 M voxels) peaks at 11 GiB above the model without
# checkpointing, and its steps take about 45 s each.
set -euo pipefail
build=${1:-build}
out=${2:-docs/plots}
mkdir -p "$out/data"
lock=()
command -v cpulock >/dev/null 2>&1 && lock=(cpulock)
for scene in ${SCENES:-small default large huge}; do
  repeats=${REPEATS:-3}
  [ "$scene" = large ] && repeats=${LARGE_REPEATS:-2}
  [ "$scene" = huge ] && repeats=${HUGE_REPEATS:-1}
  "${lock[@]}" "$build/sparse/minkunet_bench" --depths 14 --scene "$scene" --repeats "$repeats" \
    --threads "${THREADS:-2}" --json \
    > "$out/data/minkunet14-$scene.json"
  cat "$out/data/minkunet14-$scene.json"
done
python3 "$(dirname "$0")/minkunet_scaling.py" --depth 14 --out "$out" "$out"/data/minkunet14-*.json
