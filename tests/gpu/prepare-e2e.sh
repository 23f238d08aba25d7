#!/usr/bin/env bash
# Prepares tests/gpu/e2e.sh's device run (issue 41), here, before a GPU
# machine is lent: the bundle it carries, built against the GPU machine's
# torch. The lent machines run torch 2.11.0+cu130 under Python 3.12
# (/work/.library/device/KINDS.md), and a worker runs only against the
# LibTorch it was built with. So this script
#   1. installs that torch from PyPI into its own virtual environment,
#      .gpu/torch-VERSION (kept: a second run reuses it), and checks that
#      its CUDA is major version 13, as this machine's nvcc and the device's
#      driver are;
#   2. builds trainsup-worker against it (deploy/build-worker.sh, build tree
#      build-gpu-worker/, kept for the next run);
#   3. puts that worker beside the main build's trainsupd, trainctl and
#      Python client (which do not link torch) in OUT/stage;
#   4. bundles them (deploy/bundle.sh --tar) into OUT/trainsup.tar.xz,
#      checked to fit a device call;
# then prints the device call to make. The main build (build/) must be
# there: `cmake --build build` first.
#
# --main-torch: skips 1 and 2 and bundles the main build's worker (built
# against this machine's torch). That bundle does not run on the device;
# it checks this script's plumbing here (tests/gpu/CMakeLists.txt runs
# e2e.sh --cpu-only on such a bundle).
#
# Usage: tests/gpu/prepare-e2e.sh [--torch VERSION] [--jobs N] [--main-torch]
#                                 [--out DIR]
#   --torch VERSION  the device's torch (default 2.11.0)
#   --jobs N         compile jobs for the worker (default: the CPUs)
#   --out DIR        where the bundle goes (default .gpu, which a device
#                    call carries; git ignores it)
# Exit 0 with OUT/trainsup.tar.xz; 1 naming what failed; 64 on bad usage.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
torch_version=2.11.0
cuda_major=13
jobs=$(nproc)
main_torch=0
out="$root/.gpu"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --torch) torch_version=${2:?--torch needs a version}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    --main-torch) main_torch=1; shift ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    *) echo "prepare-e2e.sh: unknown argument '$1' (see the usage at the top of $0)" >&2; exit 64 ;;
  esac
done
say() { echo "prepare-e2e: $*" >&2; }
fail() { say "$*"; exit 1; }

main="$root/build"
for p in trainsupd trainctl trainsup-worker; do
  [[ -x $main/bin/$p ]] || fail "$main/bin/$p is missing: run 'cmake --build build' first"
done
[[ -d $main/python/venv ]] || fail "$main/python/venv is missing: run 'cmake --build build' first"

mkdir -p "$out"
out=$(cd "$out" && pwd)
stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/python"
cp "$main/bin/trainsupd" "$main/bin/trainctl" "$stage/bin/"
ln -s "$main/python/venv" "$stage/python/venv"

if [[ $main_torch == 1 ]]; then
  cp "$main/bin/trainsup-worker" "$stage/bin/"
  say "bundling the main build's worker (this machine's torch; not for the device)"
else
  venv="$root/.gpu/torch-$torch_version"
  python="$venv/bin/python"
  have=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
  if [[ $have != "$torch_version"* ]]; then
    say "installing torch==$torch_version into $venv (PyPI)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$python" -m pip install --quiet --disable-pip-version-check "torch==$torch_version" ||
      fail "pip could not install torch==$torch_version"
  fi
  cuda=$("$python" -c 'import torch; print(torch.version.cuda or "none")')
  [[ ${cuda%%.*} == "$cuda_major" ]] ||
    fail "torch $torch_version from PyPI has CUDA $cuda; the device's is $cuda_major.x"
  say "torch $("$python" -c 'import torch; print(torch.__version__)') with CUDA $cuda"
  "$root/deploy/build-worker.sh" --python "$python" --dest "$stage/bin/trainsup-worker" \
    --build-dir "$root/build-gpu-worker" --jobs "$jobs" >&2 ||
    fail "building the worker against torch $torch_version failed"
fi

"$root/deploy/bundle.sh" --build "$stage" --out "$out/trainsup" --tar >&2 ||
  fail "deploy/bundle.sh failed"
rm -rf "$stage" "$out/trainsup"
bytes=$(stat -c %s "$out/trainsup.tar.xz")
say "bundle: $out/trainsup.tar.xz, $((bytes / 1024 / 1024)) MiB"
data="data/samples/urban.las"
[[ -f $root/$data ]] || say "warning: $data is missing: deploy/fetch-sample-data.sh fetches it"
cat <<EOF
The device call (one run, about 8 minutes; docs/operations.md, "On a GPU box"):
  run(command="DEADLINE=470 bash tests/gpu/e2e.sh --bundle .gpu/trainsup.tar.xz",
      carry=[".gpu/trainsup.tar.xz", "data/samples"], timeout_s=540)
then commit \$OUT's e2e logs under docs/bench-logs/ with the machine's name.
EOF
