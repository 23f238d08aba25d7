#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine to build, test and run trainsup.
# Idempotent; run as root (or through sudo). Installs exactly the Debian
# packages the project needs, the pinned PyPI torch wheel (its LibTorch, with
# CUDA, NCCL and cuDNN) into the project's virtual environment, selects
# OpenBLAS for the engine's products and prints which one is active.
#
# TRAINSUP_VENV (default /opt/trainsup/venv) is where torch goes; the build
# finds it there by itself (cmake/TrainsupLibTorch.cmake).
#
# bootstrap.sh --worker-build-deps installs only what building
# trainsup-worker against the machine's own torch needs
# (deploy/build-worker.sh): no torch, no daemon libraries, no test tools.
set -euo pipefail

worker_only=0
case "${1:-}" in
  "") ;;
  --worker-build-deps) worker_only=1 ;;
  *) echo "bootstrap.sh: unknown argument '$1' (--worker-build-deps or nothing)" >&2; exit 64 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then exec sudo -E bash "$0" "$@"; fi
  echo "bootstrap.sh: must run as root (apt-get install)" >&2
  exit 1
fi

worker_packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # engine and worker: LibTorch is the torch wheel's (below); Gloo's headers
  # for ProcessGroupGloo.hpp (the wheel ships none; its code is the wheel's),
  # OpenBLAS for the engine's products
  libgloo-dev libopenblas0-pthread libopenblas-dev
  # the worker channel and the contracts
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev
)
packages=(
  "${worker_packages[@]}"
  # the virtual environment for torch
  python3-venv
  # API and daemon
  libboost1.81-dev libboost-filesystem1.81-dev
  libsqlite3-dev libsystemd-dev prometheus-cpp-dev
  # multi-node jobs: etcd (the tests start their own on loopback) and the
  # .proto files of its v3 API, compiled at build time (docs/building.md)
  etcd-server golang-etcd-server-dev
  # the training metrics' test starts a real Prometheus on loopback
  prometheus
  # the two-host test (a network namespace and a veth pair; it skips, with
  # the reason, where it cannot make them) and the TLS test's certificates
  iproute2 openssl
  # shared libraries
  libspdlog-dev libcli11-dev
  # tests and benchmarks; clang's libFuzzer and sanitizers for fuzz/
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
  # the style test (tests/style): the sources as clang-format 14 formats them
  clang-format-14
  # trainsupd's stack capture of hung workers; deploy checks (systemd-analyze,
  # the dashboard and config checkers)
  gdb systemd python3
  # docs/examples/dashboard_client.py and its test (Debian's /usr/bin/python3)
  python3-grpcio python3-protobuf
  # python/trainsup, the training-script client: XXH3-128 for the checkpoint
  # manifest (the venv sees Debian's python3-grpcio, python3-protobuf and
  # python3-xxhash; its torch runs the tests' PyTorch scripts)
  python3-xxhash
  # docs/plots: the benchmark plots of docs/benchmarks.md (pngcairo)
  gnuplot-nox
  # the Debian package (tests/package): manual pages from --help, lintian,
  # and a clean Debian 12 root to install it into
  help2man lintian debootstrap
  # the GPU machine's bundle (deploy/bundle.sh): its RPATH
  patchelf xz-utils
)

if [ "$worker_only" -eq 1 ]; then packages=("${worker_packages[@]}"); fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "bootstrap: all ${#packages[@]} packages already installed"
fi

if [ "$worker_only" -eq 1 ]; then
  echo "bootstrap: the worker's build dependencies are installed (deploy/build-worker.sh)"
  exit 0
fi

# The pinned torch wheel in the project's virtual environment. The venv sees
# Debian's site packages (grpcio, protobuf, xxhash for the Python client);
# its own torch comes first. A second run finds the version installed and
# downloads nothing.
torch_version=2.15.0
venv=${TRAINSUP_VENV:-/opt/trainsup/venv}
if [ ! -x "$venv/bin/python3" ]; then
  echo "bootstrap: creating the virtual environment $venv"
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
installed=$("$venv/bin/python3" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ "${installed%%+*}" != "$torch_version" ]; then
  echo "bootstrap: installing torch==${torch_version} into $venv (was: ${installed:-none})"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check --no-input \
    "torch==${torch_version}"
fi
"$venv/bin/python3" - <<'PY'
import torch
print("bootstrap: torch %s, torch.version.cuda %s, C++11 ABI %s, at %s" % (
    torch.__version__, torch.version.cuda, int(torch._C._GLIBCXX_USE_CXX11_ABI),
    torch.__file__.rsplit("/", 1)[0]))
PY

# The engine calls the system BLAS through the libblas.so.3 alternative.
# Debian may leave the reference BLAS selected; pick OpenBLAS (pthread build).
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
openblas_blas="/usr/lib/${arch}/openblas-pthread/libblas.so.3"
openblas_lapack="/usr/lib/${arch}/openblas-pthread/liblapack.so.3"
if [ -e "$openblas_blas" ]; then
  update-alternatives --set "libblas.so.3-${arch}" "$openblas_blas" >/dev/null
fi
if [ -e "$openblas_lapack" ]; then
  update-alternatives --set "liblapack.so.3-${arch}" "$openblas_lapack" >/dev/null
fi
active=$(readlink -f "/usr/lib/${arch}/libblas.so.3")
echo "bootstrap: active BLAS (libblas.so.3) -> ${active}"
case "$active" in
  *openblas*) ;;
  *) echo "bootstrap: WARNING: libblas.so.3 is not OpenBLAS; matrix products will be slow" >&2 ;;
esac

# The real, labelled sample scans (CC0) from Debian's libcgal-demo, extracted
# into data/samples/ without installing the package; the tests and the demo
# train on them.
bash "$(dirname "$0")/fetch-sample-data.sh"
