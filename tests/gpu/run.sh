#!/usr/bin/env bash
# The engine on a GPU, in one prepared run (issue 11): on a machine with an
# NVIDIA GPU and a Python torch built with CUDA, it
#   1. builds sparse/ (TRAINSUP_SPARSE_ONLY: the worker needs gRPC, Boost and
#      Protobuf, which such machines lack) against that torch, with the CUDA
#      backend, its cross-backend tests and the engine benchmark;
#   2. runs the cross-backend tests (every op on cpu, generic-on-cpu,
#      generic-on-cuda and cuda against the CPU reference, forward and
#      gradients), the determinism checks on CUDA (CudaDeterminism.*: a
#      deterministic step, and the fused dataflow's ops bit for bit against
#      the host launcher's) and the
#      out-of-memory test under a small allocator fraction (CudaMemory.*),
#      and the launch budget of a convolution layer, counted by the
#      profiler (CudaLaunchBudget.*);
#   3. runs minkunet_bench on cuda:0 with the generic and the cuda backend,
#      then the cuda backend at fp32, bf16 and fp16 (TF32 off) and at fp32
#      with TF32 on (issue 44's figures, "precision" in the JSON);
# and prints one JSON object on stdout. Progress goes to stderr, logs and
# the raw results to build-gpu/out; where $OUT is set (the device tool's
# folder, which returns at most 8 files), the JSON goes to $OUT/run.json
# and build-gpu/out, packed, to $OUT/run.tgz.
# Sized for under 8 minutes on 16 cores, build included.
#
# Usage:
#   tests/gpu/run.sh              on the GPU machine
#   tests/gpu/run.sh --prepare    here, first: copies GoogleTest's sources
#                                 (Debian's /usr/src/googletest) to .gpu/ so
#                                 they travel with the tree (carry .gpu/googletest)
#   tests/gpu/run.sh --cpu-only   builds and runs everything that needs no
#                                 GPU with this machine's LibTorch (the GPU
#                                 tests skip; "ok" is then false)
#
# PROFILE_SCENES (e.g. "small default large"): afterwards, minkunet_bench
# on those scenes with both CUDA paths, and --profile with the cuda one,
# into profile.txt.
#
# BUILD_TIMEOUT (seconds, default 330) caps the build; a 2-core machine
# needs more for --cpu-only. DEADLINE (seconds, default 480 on the GPU, 3600
# with --cpu-only) bounds the whole run: each stage gets the smaller of its
# cap and the time left, stages that no longer fit are skipped, and the JSON
# is always printed before it (call the device tool with timeout_s >= 500).
#
# Exit status: 0 when everything ran and passed on a GPU, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mode=gpu
case "${1:-}" in
  --prepare) mode=prepare ;;
  --cpu-only) mode=cpu ;;
  "") ;;
  *)
    echo "usage: $0 [--prepare | --cpu-only]" >&2
    exit 64
    ;;
esac

if [[ $mode == prepare ]]; then
  src=${GTEST_SOURCE:-/usr/src/googletest}
  [[ -f $src/CMakeLists.txt ]] || { echo "no GoogleTest sources at $src" >&2; exit 1; }
  rm -rf "$root/.gpu/googletest"
  mkdir -p "$root/.gpu"
  cp -r "$src" "$root/.gpu/googletest"
  echo "copied $src to .gpu/googletest ($(du -sh "$root/.gpu" | cut -f1)); carry .gpu/googletest" >&2
  exit 0
fi

build="$root/build-gpu"
[[ $mode == cpu ]] && build="$root/build-gpu-cpu-only"
# One deadline for the whole run (the device tool kills a command at its
# limit, and then no JSON is printed): each stage gets the smaller of its
# own cap and what is left, less 15 s for the summary.
default_deadline=480
[[ $mode == cpu ]] && default_deadline=3600
# shellcheck source=tests/gpu/lib.sh
source "$root/tests/gpu/lib.sh"
gpu_begin run "$build/out" "${DEADLINE:-$default_deadline}" 15
jobs=$(nproc)

# Everything the JSON reports, as KEY=VALUE lines for the summary at the end.
facts="$out/facts.txt"
: >"$facts"
fact() { printf '%s=%s\n' "$1" "$2" >>"$facts"; }
fact mode "$mode"

# Publishes the JSON (lib.sh). Its status: 0 when "ok".
summary() {
  local json status=0
  json=$(python3 - "$facts" "$out" "$start" <<'PY'
import json, os, sys, time
facts_file, out, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
facts = {}
for line in open(facts_file):
    k, _, v = line.rstrip("\n").partition("=")
    facts[k] = v
def load(name):
    p = os.path.join(out, name)
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def tests(report):
    """Counts and failures of a gtest JSON report; gpu_skipped counts the
    skipped tests that need a GPU (Cuda* suites, */cuda targets)."""
    if report is None:
        return None
    r = {"passed": 0, "failed": 0, "skipped": 0, "gpu_skipped": 0, "failures": []}
    for suite in report.get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = suite["name"] + "." + t["name"]
            if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                r["skipped"] += 1
                if name.startswith("Cuda") or name.endswith("cuda"):
                    r["gpu_skipped"] += 1
            elif t.get("failures"):
                r["failed"] += 1
                r["failures"].append({"test": name,
                                      "message": t["failures"][0]["failure"][:600]})
            else:
                r["passed"] += 1
    return r
result = {
    "ran_on_gpu": facts.get("mode") == "gpu" and facts.get("gpu", "") != "",
    "gpu": facts.get("gpu", ""),
    "torch": facts.get("torch", ""),
    "torch_cuda": facts.get("torch_cuda", ""),
    "cuda_backend_built": facts.get("cuda_backend") == "ON",
    "configure_s": int(facts["configure_s"]) if "configure_s" in facts else None,
    "build_s": int(facts["build_s"]) if "build_s" in facts else None,
    "stage_failed": facts.get("stage_failed", ""),
}
result["cross_backend"] = tests(load("cross_backend.json"))
result["determinism"] = tests(load("determinism.json"))
result["out_of_memory"] = tests(load("out_of_memory.json"))
result["launch_budget"] = tests(load("launch_budget.json"))
benches = facts.get("benches", "").split()
result["bench"] = {b: load("bench_%s.json" % b) for b in benches}
result["bench_exit"] = {b: int(facts["bench_%s_exit" % b]) for b in benches
                        if "bench_%s_exit" % b in facts}
result["precision"] = {t: load("precision_tf32_%s.json" % t) for t in ("off", "on")}
def clean(t):
    return t is not None and t["failed"] == 0 and t["passed"] > 0 and t["gpu_skipped"] == 0
result["ok"] = (result["ran_on_gpu"] and result["stage_failed"] == "" and
                all(clean(result[k]) for k in ("cross_backend", "determinism", "out_of_memory",
                                               "launch_budget")) and
                benches == ["generic", "cuda"] and
                all(result["bench"][b] is not None for b in benches))
result["total_s"] = int(time.time()) - start
print(json.dumps(result))
sys.exit(0 if result["ok"] else 1)
PY
) || status=$?
  publish "$json"
  return "$status"
}

# A stage that fails ends the run with the summary so far.
fail() {
  say "FAILED: $1 (log: $log)"
  tail -n 40 "$log" >&2 || true
  fact stage_failed "$1"
  summary
  exit 1
}

# --- What this machine has -------------------------------------------------
if [[ $mode == gpu ]]; then
  command -v nvidia-smi >/dev/null || fail "no nvidia-smi: not a GPU machine"
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 || true)
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 || true)
  [[ -n $gpu && -n $cap ]] || fail "nvidia-smi names no GPU"
  fact gpu "$gpu"
  say "GPU: $gpu (compute capability $cap)"
  torch_info=$(python3 -c 'import torch, os
print(torch.__version__, torch.version.cuda or "none", int(torch.cuda.is_available()),
      os.path.dirname(os.path.dirname(torch.__file__)), sep="|")') ||
    fail "python3 has no torch"
  IFS='|' read -r torch_version torch_cuda torch_gpu site <<<"$torch_info"
  fact torch "$torch_version"
  fact torch_cuda "$torch_cuda"
  [[ $torch_cuda != none && $torch_gpu == 1 ]] ||
    fail "torch $torch_version has no CUDA or sees no GPU (cuda $torch_cuda)"
  arch=${cap/./}
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [[ -x $nvcc ]] || fail "no nvcc"
  cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  # The wheels' CUDA libraries (nvidia/*/lib) for the linker and the loader.
  libs=$( (find "$site/nvidia" -maxdepth 2 -type d -name lib 2>/dev/null || true) | paste -sd: -)
  export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # For bench_vs_spconv.sh, which runs this build's minkunet_bench after.
  mkdir -p "$build"
  printf 'export LD_LIBRARY_PATH=%q\n' "$LD_LIBRARY_PATH" >"$build/env.sh"
  link_flags="-Wl,-rpath-link,${libs:-$cuda_root/lib64}"
  # LibTorch's CMake sets CMAKE_CUDA_ARCHITECTURES OFF and takes the
  # architectures from TORCH_CUDA_ARCH_LIST: both are given. FindBLAS stays
  # off: the ATen-matmul path (blas_aten.cc) is the one tested without
  # OpenBLAS.
  cmake_args=(-DTRAINSUP_PYTHON="$(command -v python3)" -DTRAINSUP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
              -DTORCH_CUDA_ARCH_LIST="$cap" -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=TRUE
              -DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$cuda_root"
              -DCMAKE_EXE_LINKER_FLAGS="$link_flags")
  export TORCH_CUDA_ARCH_LIST="$cap"
  # cuBLAS is deterministic run to run on one stream; this also covers the
  # workspaces of several.
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  fact tools "$(cmake --version | head -n 1); $(g++ --version | head -n 1); $("$nvcc" --version | tail -n 1)"
  fact cxx11_abi "$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' || true)"
else
  fact gpu ""
  fact torch "$("${TRAINSUP_VENV:-/opt/trainsup/venv}/bin/python3" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "the LibTorch CMake finds")"
  cmake_args=(-DTRAINSUP_CUDA=ON)
fi
if [[ -f $root/.gpu/googletest/CMakeLists.txt ]]; then
  cmake_args+=(-DTRAINSUP_GTEST_SOURCE_DIR="$root/.gpu/googletest")
elif [[ $mode == gpu ]]; then
  fail "no .gpu/googletest: run tests/gpu/run.sh --prepare here and carry .gpu/googletest"
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# --- Configure and build ----------------------------------------------------
t0=$(date +%s)
say "configuring in $build"
# Tests are listed when run, not at build time (no ctest here).
timeout "$(left 120)" cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTRAINSUP_SPARSE_ONLY=ON \
  -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST "${cmake_args[@]}" >>"$log" 2>&1 ||
  fail "configure"
fact configure_s "$(($(date +%s) - t0))"
if grep -q "CUDA backend: ON" "$log"; then fact cuda_backend ON; else fact cuda_backend OFF; fi
if [[ $mode == gpu ]] && ! grep -q "CUDA backend: ON" "$log"; then
  fail "configure: the LibTorch found has no CUDA"
fi
t0=$(date +%s)
say "building with $jobs jobs"
timeout "$(left "${BUILD_TIMEOUT:-330}")" cmake --build "$build" -j "$jobs" \
  --target sparse_backend_tests minkunet_bench >>"$log" 2>&1 || fail "build"
fact build_s "$(($(date +%s) - t0))"
if [[ $mode == gpu ]]; then
  # Which architectures the kernels were built for (sm_90 on an H200).
  kernels=$(find "$build/sparse/cuda" -name 'libtrainsup_sparse_cuda_kernels*' | head -n 1)
  elf=$( (cuobjdump --list-elf "$kernels" 2>/dev/null || true) | grep -o 'sm_[0-9]*[a-z]*' | sort -u | paste -sd' ' - || true)
  fact cuda_elf "$elf"
  say "CUDA kernels built for: ${elf:-unknown}"
fi

# --- Tests ------------------------------------------------------------------
tests="$build/tests/sparse/sparse_backend_tests"
run_tests() {  # name filter
  local limit
  limit=$(left 150)
  if ((limit < 10)); then say "tests $1: skipped, the deadline is near"; fact "skipped_$1" 1; return; fi
  say "tests: $1 ($2)"
  timeout "$limit" "$tests" --gtest_filter="$2" --gtest_output="json:$out/$1.json" \
    >>"$log" 2>&1 || say "tests $1: some failed (see $out/$1.json)"
}
run_tests determinism 'CudaDeterminism.*:Determinism.*'
run_tests out_of_memory 'CudaMemory.*:Memory.*'
run_tests cross_backend '*CrossBackend.*:Backend.*'
run_tests launch_budget 'CudaLaunchBudget.*'

# --- Benchmark --------------------------------------------------------------
# On the GPU: the default scene on cuda:0 with both CUDA paths. --cpu-only:
# the small scene once on the CPU, to exercise this part of the script.
if [[ $mode == gpu ]]; then
  backends=(generic cuda)
  bench_args=(--device cuda --repeats 3)
else
  backends=(cpu generic)
  bench_args=(--device cpu --scene small --repeats 1)
fi
fact benches "${backends[*]}"
for backend in "${backends[@]}"; do
  limit=$(left 120)
  if ((limit < 10)); then say "minkunet_bench --backend $backend: skipped, the deadline is near"; fact "bench_${backend}_exit" 124; continue; fi
  say "minkunet_bench ${bench_args[*]} --backend $backend"
  status=0
  timeout "$limit" "$build/sparse/minkunet_bench" "${bench_args[@]}" --backend "$backend" --depths 14 \
    --json >"$out/bench_$backend.json" 2>>"$log" || status=$?
  fact "bench_${backend}_exit" "$status"
done

# --- Precisions (issue 44): fp32, TF32, bf16 and fp16 in the same call -------
# The cuda backend on the default scene: fp32, bf16 and fp16 with TF32 off
# in one run (ratios in one process), then fp32 with TF32 on (a process
# setting). Reported in the JSON, not part of "ok": they are figures.
if [[ $mode == gpu ]]; then
  for tf32 in off on; do
    precisions=fp32,bf16,fp16
    [[ $tf32 == on ]] && precisions=fp32
    limit=$(left 120)
    if ((limit < 10)); then say "precisions, TF32 $tf32: skipped, the deadline is near"; continue; fi
    say "minkunet_bench --backend cuda --precisions $precisions --tf32 $tf32"
    timeout "$limit" "$build/sparse/minkunet_bench" --device cuda --backend cuda --repeats 3 \
      --depths 14 --precisions "$precisions" --tf32 "$tf32" --json \
      >"$out/precision_tf32_$tf32.json" 2>>"$log" || say "precisions, TF32 $tf32: exit $?"
  done
fi

# --- Optional: how the CUDA paths scale and where their host time goes --------
# PROFILE_SCENES="small default large" runs minkunet_bench --profile on
# each scene with both CUDA paths, into profile.txt (not in the JSON).
if [[ $mode == gpu && -n ${PROFILE_SCENES:-} ]]; then
  for scene in $PROFILE_SCENES; do
    for run in "generic" "cuda" "cuda --profile"; do
      limit=$(left 90)
      if ((limit < 10)); then say "scene $scene, $run: skipped, the deadline is near"; continue; fi
      say "minkunet_bench --scene $scene --backend $run"
      echo "=== scene $scene, backend $run" >>"$out/profile.txt"
      # shellcheck disable=SC2086  # "cuda --profile" is two arguments
      timeout "$limit" "$build/sparse/minkunet_bench" --device cuda --repeats 3 --depths 14 \
        --scene "$scene" --backend $run >>"$out/profile.txt" 2>&1 ||
        echo "exit $?" >>"$out/profile.txt"
    done
  done
fi

say "done"
summary
