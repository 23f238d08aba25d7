#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (deploy/bootstrap.sh), builds trainsup
# and runs the whole test suite with ctest. The last lines are ctest's
# summary, then what a failing fuzz target found.
# Usage: bash deploy/run-tests.sh   (root, or a user with sudo)
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
rc=0
ctest --output-on-failure --timeout 600 -j "$(nproc)" || rc=$?
# A fuzz target's failure scrolls away among hundreds of tests: what it
# found (the input that crashed, in base64) goes last, where a CI log's
# tail shows it. Reproduce: base64 -d >crash; build/fuzz/NAME_fuzzer crash
if [ "$rc" -ne 0 ] && compgen -G "fuzz/artifacts/*" >/dev/null; then
  echo "== fuzz findings (build/fuzz/artifacts):"
  for f in fuzz/artifacts/*; do
    echo "-- $(basename "$f") ($(stat -c %s "$f") bytes), base64:"
    head -c 3000 "$f" | base64 -w 0
    echo
  done
fi
exit "$rc"
