#!/usr/bin/env bash
# Builds trainsup-worker against this machine's own torch and installs it
# where trainsupd's configuration points (docs/operations.md, "The worker").
# The Debian package carries the daemon, trainctl and the Python client, not
# the worker: the worker links LibTorch, and each training box has its own
# torch, CUDA and driver.
#
# Usage: deploy/build-worker.sh [--python PY | --libtorch DIR] [--config FILE]
#                               [--dest PATH] [--build-dir DIR] [--jobs N]
#   --python PY      build against PY's torch (default: python3 on PATH)
#   --libtorch DIR   build against an unpacked LibTorch (or a wheel's
#                    site-packages/torch) instead
#   --config FILE    trainsupd's configuration (default:
#                    /etc/trainsup/trainsupd.toml); the worker goes where
#                    `trainsupd --config FILE --print-worker-binary` says
#   --dest PATH      install there instead (no trainsupd needed)
#   --build-dir DIR  the build tree (default: build-worker in the sources);
#                    kept, so a second run only rebuilds what changed
#   --jobs N         parallel compile jobs (default: the number of CPUs)
#
# It needs the build tools and the worker's libraries (gRPC, Protobuf,
# abseil, toml++, nlohmann-json, xxhash, spdlog, OpenBLAS, Gloo's headers):
# on Debian 12, `deploy/bootstrap.sh --worker-build-deps` installs exactly
# those. The new binary replaces the old one by a rename: workers running
# now keep the old one, the next launch takes the new one.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
python=""
libtorch=""
config=/etc/trainsup/trainsupd.toml
dest=""
build_dir="$src/build-worker"
jobs=$(nproc)

die() { echo "build-worker.sh: $*" >&2; exit 64; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python=${2:?--python needs an interpreter}; shift 2 ;;
    --libtorch) libtorch=${2:?--libtorch needs a directory}; shift 2 ;;
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --dest) dest=${2:?--dest needs a path}; shift 2 ;;
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -z "$python" ] || [ -z "$libtorch" ] || die "--python and --libtorch exclude each other"

torch_args=()
if [ -n "$libtorch" ]; then
  [ -f "$libtorch/share/cmake/Torch/TorchConfig.cmake" ] ||
    die "$libtorch is not a LibTorch (no share/cmake/Torch/TorchConfig.cmake)"
  torch_args=(-DTRAINSUP_TORCH_DIR="$(cd "$libtorch" && pwd)")
else
  python=${python:-$(command -v python3 || true)}
  [ -n "$python" ] || die "no python3 on PATH; pass --python or --libtorch"
  torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
    die "$python cannot import torch; pass the python of the environment that has it, or --libtorch"
  echo "build-worker.sh: torch $torch_version of $python"
  # Clear a LibTorch an earlier run of this build tree named: it would win.
  torch_args=(-DTRAINSUP_PYTHON="$python" -DTRAINSUP_TORCH_DIR=)
fi

# Where the daemon launches the worker from.
if [ -z "$dest" ]; then
  trainsupd=$(command -v trainsupd || true)
  [ -n "$trainsupd" ] || die "trainsupd is not installed; install the trainsup package or pass --dest"
  [ -f "$config" ] || die "$config does not exist; pass --config or --dest"
  dest=$("$trainsupd" --config "$config" --print-worker-binary) ||
    die "trainsupd cannot read $config"
  daemon_version=$("$trainsupd" --version | awk '{print $2}')
  source_version=$(cat "$src/VERSION")
  if [ "$daemon_version" != "$source_version" ]; then
    echo "build-worker.sh: warning: trainsupd is $daemon_version, these sources are" \
      "$source_version; the daemon refuses a worker of another minor version" >&2
  fi
fi
case "$dest" in
  /*) ;;
  *) die "the destination must be an absolute path, not '$dest'" ;;
esac

cmake -S "$src" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTRAINSUP_WORKER_ONLY=ON -DTRAINSUP_BUILD_TESTS=OFF -DTRAINSUP_BUILD_BENCH=OFF \
  "${torch_args[@]}"
cmake --build "$build_dir" --target trainsup-worker -j "$jobs"
built="$build_dir/bin/trainsup-worker"
"$built" --version

install -d "$(dirname "$dest")"
install -m 0755 "$built" "$dest.new"
mv -f "$dest.new" "$dest"
echo "build-worker.sh: installed $("$dest" --version) as $dest"
