#!/usr/bin/env bash
# Issue 11's CPU table in one run, for whatever machine this is: the FMA
# ceiling (fma_peak), then sparse_bench and minkunet_bench for every fused
# kernel set the CPU has against the BLAS path, the sets' runs interleaved
# so that all of them see the same load; prints a Markdown table of
# medians (docs/benchmarks.md) and keeps every program's JSON.
#
#   bash sparse/bench/kernel_sets_report.sh [BUILD_DIR] [OUT_DIR]
#
# RUNS (default 5): sparse_bench runs per set; UNET_RUNS (default 2):
# minkunet_bench runs per set (MinkUNet14, --repeats UNET_REPEATS, default
# 5); THREADS (default 2). The AVX2 set and its BLAS baseline run with
# OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE=Haswell, what OpenBLAS
# picks on Zen), so that both sides of its ratio use 256-bit vectors; the
# AVX-512 set with the kernels OpenBLAS picks (the worker re-executes with
# SkylakeX on a Xeon it takes for Prescott). OMP_WAIT_POLICY=ACTIVE as in
# docs/benchmarks.md. Each program runs under cpulock when there is one.
# The MinkUNet runs alternate which side goes first (a host that slows
# down during the run would otherwise always penalise the same side).
# OUT_DIR's earlier JSON files are removed first; the table is printed and
# kept as OUT_DIR/report.md. About 20 minutes on a 2-core machine with two
# sets.
set -euo pipefail
build=${1:-build}
out=${2:-$build/kernel-sets-report}
mkdir -p "$out"
rm -f "$out"/*.json "$out/report.md"
lock=()
command -v cpulock >/dev/null 2>&1 && lock=(cpulock)
runs=${RUNS:-5}
unet_runs=${UNET_RUNS:-2}
threads=${THREADS:-2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-ACTIVE}

for program in fma_peak sparse_bench minkunet_bench; do
  [[ -x $build/sparse/$program ]] || {
    echo "kernel_sets_report: no $build/sparse/$program (build the benchmarks first)" >&2
    exit 1
  }
done

# The fused sets this CPU has (the benchmark's own detection decides what
# runs: a set the CPU lacks falls back, and the JSON says which ran).
sets=()
grep -qw avx512f /proc/cpuinfo && sets+=(avx512)
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && sets+=(avx2)
((${#sets[@]} > 0)) || {
  echo "kernel_sets_report: this CPU has neither AVX-512 nor AVX2+FMA: only the BLAS path runs" >&2
  exit 1
}
# env(1) arguments for OpenBLAS in the comparison of set $1.
blas_env() {
  if [[ $1 == avx512 ]]; then
    echo "-u OPENBLAS_CORETYPE -u TRAINSUP_KEEP_BLAS_CORETYPE"
  else
    echo "OPENBLAS_CORETYPE=Haswell"
  fi
}

say() { echo "[kernel_sets_report] $*" >&2; }
run() {  # output-file, environment..., -- program args...
  local file=$1
  shift
  local envs=()
  while [[ $1 != "--" ]]; do
    envs+=("$1")
    shift
  done
  shift
  "${lock[@]}" env "${envs[@]}" "$@" --json >"$file"
}

say "fma_peak (before)"
run "$out/fma_peak-before.json" -- "$build/sparse/fma_peak" --threads "$threads"
for ((i = 1; i <= runs; ++i)); do
  for set in "${sets[@]}"; do
    say "sparse_bench $set, run $i of $runs"
    # shellcheck disable=SC2046 # blas_env's words are separate arguments
    run "$out/sparse_bench-$set-$i.json" $(blas_env "$set") TRAINSUP_KERNELS="$set" -- \
      "$build/sparse/sparse_bench" --threads "$threads"
  done
done
for ((i = 1; i <= unet_runs; ++i)); do
  for set in "${sets[@]}"; do
    sides=("$set" blas)
    ((i % 2 == 0)) && sides=(blas "$set")
    for kernels in "${sides[@]}"; do
      say "minkunet_bench $kernels (OpenBLAS for the $set comparison), run $i of $unet_runs"
      # shellcheck disable=SC2046
      run "$out/minkunet_bench-$set-$kernels-$i.json" $(blas_env "$set") \
        TRAINSUP_KERNELS="$kernels" -- \
        "$build/sparse/minkunet_bench" --depths 14 --repeats "${UNET_REPEATS:-5}" \
        --threads "$threads"
    done
  done
done
say "fma_peak (after)"
run "$out/fma_peak-after.json" -- "$build/sparse/fma_peak" --threads "$threads"
python3 "$(dirname "$0")/kernel_sets_report.py" "$out" "${sets[@]}" | tee "$out/report.md"
