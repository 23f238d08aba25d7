#!/usr/bin/env bash
# Runs tests/package/train_without_torch.py as a [command] run under a real
# trainsupd started on a configuration of its own in WORK, with PYTHON as
# the allowed interpreter, and checks its history (check_history.py): the
# package tests' "run against a real daemon".
# Usage: script_under_daemon.sh SOURCE_DIR TRAINSUPD TRAINCTL PYTHON WORK
set -euo pipefail
src=$1
trainsupd=$2
trainctl=$3
python=$4
work=$5
fail() { echo "script_under_daemon: FAIL: $*" >&2; exit 1; }

rm -rf "$work/state" "$work/data"
mkdir -p "$work/state" "$work/data/job"
cp "$src/tests/package/train_without_torch.py" "$work/data/job/train.py"
cat >"$work/trainsupd.toml" <<CONF
[daemon]
state_dir = "$work/state"
data_roots = ["$work/data"]
[commands]
allowed_programs = ["$python"]
CONF
cat >"$work/data/job/spec.toml" <<SPEC
name = "script"
[command]
argv = ["$python", "$work/data/job/train.py"]
cwd = "$work/data/job"
heartbeats = true
total_steps = 20
SPEC
"$trainsupd" --config "$work/trainsupd.toml" >"$work/trainsupd.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
socket="$work/state/run/trainsupd.sock"
for _ in $(seq 1 100); do
  [ -S "$socket" ] && [ -s "$work/state/auth/operator.token" ] && break
  sleep 0.1
done
ctl() { "$trainctl" --socket "$socket" --timeout 30 "$@"; }
id=$(ctl --token-file "$work/state/auth/operator.token" submit "$work/data/job/spec.toml")
set +e
ctl --token-file "$work/state/auth/viewer.token" watch "$id"
rc=$?
set -e
ctl --token-file "$work/state/auth/viewer.token" describe "$id" -o json >"$work/describe.json"
for log in "$work"/state/runs/"$id"/attempts/*/rank-0.log; do echo "== $log"; cat "$log"; done
[ "$rc" -eq 0 ] || { cat "$work/trainsupd.log"; fail "trainctl watch exited $rc"; }
python3 "$src/tests/package/check_history.py" "$work/describe.json"
grep -h "trainsup client" "$work"/state/runs/"$id"/attempts/1/rank-0.log
