#!/usr/bin/env bash
# The GPU machine's bundle (deploy/bundle.sh, issue 41), tested here on the
# main build: in a clean Debian 12 root with none of the project's Debian
# packages (no gRPC, Protobuf, Boost, SQLite, spdlog), the bundled programs
#   * start: trainsupd --version, trainctl --version, trainsup-worker --version;
#   * train: the bundled trainsupd launches the bundled trainsup-worker on one
#     CPU slot for a short run, submitted and watched with the bundled
#     trainctl, and it ends SUCCEEDED.
# The worker finds torch as on the GPU machine: LD_LIBRARY_PATH from
# bin/torch-libs of the torch environment, mounted read-only at its path.
# Also checks that the compressed bundle fits a device call (bundle.sh --tar).
# Needs root; Debian's mirror the first time (clean_root.sh keeps a tarball).
# Usage: bundle_root.sh SOURCE_DIR BUILD_DIR PYTHON   (exit 77: skipped, with why)
set -euo pipefail
src=$1
build=$2
python=$3
# shellcheck source=tests/package/clean_root.sh
. "$src/tests/package/clean_root.sh"
root_test bundle_root
venv=$(cd "$(dirname "$python")/.." && pwd)
[ -f "$venv/pyvenv.cfg" ] || { say "SKIP: $python is not in a virtual environment to mount"; exit 77; }

bundle="$build/bundle/trainsup"
bash "$src/deploy/bundle.sh" --build "$build" --out "$bundle" --tar >"$build/bundle.log" 2>&1 ||
  { cat "$build/bundle.log" >&2; fail "deploy/bundle.sh failed"; }
tail -2 "$build/bundle.log"
libs=$("$bundle/bin/torch-libs" "$python") || fail "torch-libs could not ask $python"
# torch-libs names the bundle's lib/ where it lies here; in the root it is
# /opt/trainsup/lib.
libs=${libs//"$(cd "$bundle/lib" && pwd)"//opt/trainsup/lib}
case "$libs" in *:/opt/trainsup/lib) ;; *) fail "torch-libs did not end with the bundle's lib/: $libs" ;; esac

root="$build/bundle-root"
make_clean_root "$root" "$build"
mkdir -p "$root/opt"
cp -a "$bundle" "$root/opt/trainsup"
cp "$src/tests/package/small_worker_run.toml" "$root/tmp/spec.toml"
cat >"$root/tmp/trainsupd.toml" <<'TOML'
[daemon]
state_dir = "/tmp/state"
worker_binary = "/opt/trainsup/bin/trainsup-worker"
[slots]
cpu_slots = 1
use_gpus = false
TOML
for pkg in libgrpc++1.51 libprotobuf32 libboost-filesystem1.81.0 libsqlite3-0 libspdlog1.10; do
  if chroot "$root" dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q installed; then
    fail "the clean root has $pkg: it would hide what the bundle lacks"
  fi
done

log="$build/bundle-root.log"
set +e
unshare --pid --fork --mount --propagation private bash -s "$root" "$venv" "$libs" \
  >"$log" 2>&1 <<'BOX'
set -euo pipefail
root=$1 venv=$2 libs=$3
step() { echo "== $*"; }
in_root() { chroot "$root" env -i PATH=/opt/trainsup/bin:/usr/bin:/bin HOME=/root \
  LD_LIBRARY_PATH="$libs" OMP_WAIT_POLICY=PASSIVE "$@"; }
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mkdir -p "$root$venv"
mount --bind "$venv" "$root$venv"
mount -o remount,bind,ro "$root$venv"

step "the programs start"
in_root trainsupd --version
in_root trainctl --version
in_root trainsup-worker --version
in_root ldd /opt/trainsup/bin/trainsup-worker | grep 'not found' && exit 1

step "the bundled daemon trains with the bundled worker"
in_root trainsupd --config /tmp/trainsupd.toml >"$root/tmp/trainsupd.log" 2>&1 &
daemon=$!
for _ in $(seq 1 100); do
  [ -S "$root/tmp/state/run/trainsupd.sock" ] && [ -s "$root/tmp/state/auth/operator.token" ] && break
  sleep 0.1
done
ctl() { in_root trainctl --socket /tmp/state/run/trainsupd.sock --timeout 30 "$@"; }
id=$(ctl --token-file /tmp/state/auth/operator.token submit /tmp/spec.toml)
set +e
ctl --token-file /tmp/state/auth/viewer.token watch "$id"
watch_rc=$?
set -e
ctl --token-file /tmp/state/auth/viewer.token describe "$id" | grep -E 'State|Trained' || true
kill -TERM "$daemon"; wait "$daemon" || true
[ "$watch_rc" -eq 0 ] || { cat "$root/tmp/trainsupd.log" "$root"/tmp/state/runs/"$id"/attempts/*/rank-0.log; exit 1; }
BOX
rc=$?
set -e
cat "$log"
[ "$rc" -eq 0 ] || fail "the bundle did not start or train in a clean root (log above)"
say "the bundle ran and trained in a clean root"
