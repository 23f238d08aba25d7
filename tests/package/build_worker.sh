#!/usr/bin/env bash
# deploy/build-worker.sh as an operator runs it: the worker built against a
# given torch (TRAINSUP_PYTHON's) and installed where a daemon's
# configuration points (worker_binary, read back with
# `trainsupd --print-worker-binary`); then that daemon trains a small run
# with the installed worker.
# Usage: build_worker.sh SOURCE_DIR BUILD_DIR PYTHON
set -euo pipefail
src=$1
build=$2
python=$3
fail() { echo "build_worker: FAIL: $*" >&2; exit 1; }
work="$build/build-worker-test"
rm -rf "$work"
mkdir -p "$work/state"
dest="$work/local/bin/trainsup-worker"
cat >"$work/trainsupd.toml" <<CONF
[daemon]
state_dir = "$work/state"
worker_binary = "$dest"
CONF
# The worker's build tree sits beside BUILD_DIR, as deploy/build-worker.sh's
# default (build-worker/) sits beside build/: the same paths relative to
# the sources, so ccache (cmake/Ccache.cmake) serves the compiles the main
# build already made.
worker_build="$(dirname "$build")/$(basename "$build")-worker"
PATH="$build/bin:$PATH" bash "$src/deploy/build-worker.sh" --python "$python" \
  --config "$work/trainsupd.toml" --build-dir "$worker_build" >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "deploy/build-worker.sh failed"; }
tail -3 "$work/build.log"
torch=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
"$dest" --version | grep -qx "trainsup-worker $(cat "$src/VERSION") (LibTorch $torch)" ||
  fail "the installed worker says: $("$dest" --version)"

# The other way to name a torch: its LibTorch directory, installed to --dest.
libtorch=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
bash "$src/deploy/build-worker.sh" --libtorch "$libtorch" --dest "$work/other/trainsup-worker" \
  --build-dir "$worker_build" >"$work/build-libtorch.log" 2>&1 ||
  { tail -40 "$work/build-libtorch.log"; fail "deploy/build-worker.sh --libtorch failed"; }
"$work/other/trainsup-worker" --version | grep -qx "trainsup-worker $(cat "$src/VERSION") (LibTorch $torch)" ||
  fail "the worker built with --libtorch says: $("$work/other/trainsup-worker" --version)"
# Bad input is refused by name, and nothing is installed.
for bad in "--libtorch /nonexistent" "--python /bin/false" "--python $python --libtorch $libtorch"; do
  # shellcheck disable=SC2086
  if bash "$src/deploy/build-worker.sh" $bad --dest "$work/bad/trainsup-worker" >"$work/bad.log" 2>&1; then
    fail "build-worker.sh $bad succeeded"
  fi
  grep -q "^build-worker.sh: " "$work/bad.log" || fail "build-worker.sh $bad: no message: $(cat "$work/bad.log")"
  [ ! -e "$work/bad" ] || fail "build-worker.sh $bad installed something"
done

cp "$src/tests/package/small_worker_run.toml" "$work/spec.toml"
"$build/bin/trainsupd" --config "$work/trainsupd.toml" >"$work/trainsupd.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
socket="$work/state/run/trainsupd.sock"
for _ in $(seq 1 100); do
  [ -S "$socket" ] && [ -s "$work/state/auth/operator.token" ] && break
  sleep 0.1
done
ctl() { "$build/bin/trainctl" --socket "$socket" --timeout 30 "$@"; }
id=$(ctl --token-file "$work/state/auth/operator.token" submit "$work/spec.toml")
ctl --token-file "$work/state/auth/viewer.token" watch "$id" ||
  { cat "$work/trainsupd.log" "$work"/state/runs/"$id"/attempts/*/rank-0.log; fail "the run failed"; }
# The worker names itself at the top of its log.
grep -q "^trainsup-worker .* at $dest\$" "$work"/state/runs/"$id"/attempts/1/rank-0.log ||
  fail "the daemon did not launch $dest: $(head -3 "$work"/state/runs/"$id"/attempts/1/rank-0.log)"
rm -rf "$work"
echo "build_worker: OK"
