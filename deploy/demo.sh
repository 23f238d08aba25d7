#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds trainsup and runs the main job.
# Until the worker and the supervisor land, the main job is the engine's
# benchmark on the embedded sample scene (the seeded synthetic room, about
# 200k points at 2 cm voxels, 2 threads). Extra arguments go to the
# benchmark (e.g. --json, --scene large).
# Usage: bash deploy/demo.sh [benchmark arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/bootstrap.sh
build=${TRAINSUP_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --target sparse_bench
exec "$build/sparse/sparse_bench" "$@"
