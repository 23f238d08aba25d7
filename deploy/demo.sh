#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds trainsup and runs the main job:
# trainsupd on a local state directory (./demo-state) supervising
# trainsup-worker, which trains a MinkUNet14 on a real labelled aerial LiDAR
# scan (urban.las from Debian's libcgal-demo, fetched by bootstrap.sh). The
# first attempt crashes on purpose at step 45 (an injected abort); the daemon
# notices at once and resumes it from its step-40 checkpoint. At the end the
# worker prints the held-out mIoU next to the majority-class baseline's, and
# trainctl the run's history.
# Usage: bash deploy/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/bootstrap.sh
build=${TRAINSUP_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --target trainsupd trainctl trainsup-worker
root=$(pwd)
state="$root/demo-state"
mkdir -p "$state"
cat > "$state/trainsupd.toml" <<TOML
# Written by deploy/demo.sh: the built-in defaults, plus where the state
# lives and which worker binary to launch.
[daemon]
state_dir = "$state"
worker_binary = "$root/$build/bin/trainsup-worker"
data_roots = ["$root/data/samples"]
[restart]
initial_backoff_s = 1
# The demo injects one crash through its spec's [testing] table.
[testing]
allow_fault_injection = true
TOML
cat > "$state/demo-run.toml" <<TOML
# MinkUNet14 on urban.las: geometry and height (its colours are all zero),
# 2 threads, held-out tiles for validation; one injected crash.
name = "demo"
[model]
arch = "minkunet14"
in_channels = 2
voxel_size = 0.5
height_feature = true
[data]
format = "las"
path = "$root/data/samples/urban.las"
val_fraction = 0.25
use_features = false
tile_size = 20
[optimizer]
kind = "sgd"
lr = 0.05
[train]
batch_size = 4
steps = 100
checkpoint_every_steps = 20
threads = 2
[testing]
crash_at_step = 45
only_attempt = 1
TOML
"$build/bin/trainsupd" --config "$state/trainsupd.toml" 2> "$state/trainsupd.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
export TRAINSUP_SOCKET="$state/run/trainsupd.sock"
export TRAINCTL_TOKEN_FILE="$state/auth/operator.token"
for _ in $(seq 100); do [ -S "$TRAINSUP_SOCKET" ] && break; sleep 0.1; done
ctl="$build/bin/trainctl"
"$ctl" node
run=$("$ctl" submit "$state/demo-run.toml")
echo "submitted $run"
status=0
"$ctl" watch "$run" || status=$?
"$ctl" describe "$run"
echo
echo "== the worker's final evaluation (held-out tiles) =="
grep -h "eval at step\|completed" "$state/runs/$run/attempts/"*/rank-0.log | tail -2
echo "daemon log: $state/trainsupd.log; worker logs: $state/runs/$run/attempts/"
exit $status
