#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (deploy/bootstrap.sh), builds trainsup
# and runs the whole test suite with ctest. The last lines are ctest's
# summary. Usage: bash deploy/run-tests.sh   (root, or a user with sudo)
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/bootstrap.sh
build=${TRAINSUP_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build"
cd "$build"
# Tests run in parallel on few cores: OpenMP threads that spin while they
# wait would steal the cores from the other tests (10x slower steps).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec ctest --output-on-failure --timeout 600 -j "$(nproc)"
