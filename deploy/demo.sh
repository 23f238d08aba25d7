#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds trainsup and runs the main job:
# trainsupd on a local state directory (./demo-state), a run submitted with
# trainctl and followed until it ends. The run crashes once on purpose and
# the daemon resumes it from its latest checkpoint. Then it prints the
# run's history and stops the daemon gracefully.
# Usage: bash deploy/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/bootstrap.sh
build=${TRAINSUP_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --target trainsupd trainctl trainsup-test-worker
root=$(pwd)
state="$root/demo-state"
mkdir -p "$state"
cat > "$state/trainsupd.toml" <<TOML
# Written by deploy/demo.sh: the built-in defaults, plus where the state
# lives and which worker binary to launch.
[daemon]
state_dir = "$state"
worker_binary = "$root/$build/bin/trainsup-test-worker"
[restart]
initial_backoff_s = 1
TOML
"$build/bin/trainsupd" --config "$state/trainsupd.toml" 2> "$state/trainsupd.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
export TRAINSUP_SOCKET="$state/run/trainsupd.sock"
export TRAINCTL_TOKEN_FILE="$state/auth/operator.token"
for _ in $(seq 100); do [ -S "$TRAINSUP_SOCKET" ] && break; sleep 0.1; done
ctl="$build/bin/trainctl"
"$ctl" node
run=$("$ctl" submit deploy/demo-run.toml)
echo "submitted $run"
status=0
"$ctl" watch "$run" || status=$?
"$ctl" describe "$run"
echo "daemon log: $state/trainsupd.log; worker logs: $state/runs/$run/attempts/"
exit $status
