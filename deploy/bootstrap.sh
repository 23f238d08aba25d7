#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine to build, test and run trainsup.
# Idempotent; run as root (or through sudo). Installs exactly the Debian
# packages the project needs, selects an optimised BLAS for LibTorch and
# prints which one is active.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then exec sudo -E bash "$0" "$@"; fi
  echo "bootstrap.sh: must run as root (apt-get install)" >&2
  exit 1
fi

packages=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # engine and worker: LibTorch (CPU) with Gloo for c10d, optimised BLAS
  libtorch-dev libgloo-dev libopenblas0-pthread libopenblas-dev
  # API and daemon
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libboost1.81-dev libboost-filesystem1.81-dev
  libsqlite3-dev libsystemd-dev prometheus-cpp-dev
  # multi-node jobs: etcd (the tests start their own on loopback) and the
  # .proto files of its v3 API, compiled at build time (docs/building.md)
  etcd-server golang-etcd-server-dev
  # shared libraries
  libspdlog-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev
  # tests and benchmarks; clang's libFuzzer and sanitizers for fuzz/
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
  # trainsupd's stack capture of hung workers; deploy checks (systemd-analyze,
  # the dashboard and config checkers)
  gdb systemd python3
  # docs/examples/dashboard_client.py and its test (Debian's /usr/bin/python3)
  python3-grpcio python3-protobuf
  # python/trainsup, the training-script client: XXH3-128 for the checkpoint
  # manifest; PyTorch for save_checkpoint/load_checkpoint and the tests that
  # run real PyTorch scripts under trainsupd (docs/python-client.md)
  python3-xxhash python3-torch
  # docs/plots: the benchmark plots of docs/benchmarks.md (pngcairo)
  gnuplot-nox
)

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

# LibTorch calls the system BLAS through the libblas.so.3 alternative.
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
