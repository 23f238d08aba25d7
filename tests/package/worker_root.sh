#!/usr/bin/env bash
# A training box set up the way docs/operations.md ("Install") says, in a
# clean Debian 12 root (issue 27): the .deb installed with apt, then
# `deploy/bootstrap.sh --worker-build-deps` and `deploy/build-worker.sh
# --python PY` from the sources, against the box's own torch; then the
# packaged trainsupd, run as the trainsup user, trains a small run with the
# worker that was built. The box's torch is PYTHON's virtual environment
# (the set-up script's), mounted read-only at the same path; the box's
# python3 is Debian's, installed first as a box would have it. For a CUDA
# torch the build is first tried without the CUDA toolkit (it must fail
# with the message that names the toolkit), then with this machine's
# toolkit mounted read-only at /usr/local/cuda.
#
# This is the check that found that deploy/build-worker.sh could not
# configure on a stock Debian 12 box with CUDA 13 (CMake 3.25's
# FindCUDAToolkit and nvToolsExt: sparse/cuda/CMakeLists.txt).
# Needs root and Debian's mirror; a cold build of the worker (minutes).
# Usage: worker_root.sh SOURCE_DIR BUILD_DIR PYTHON   (exit 77: skipped, with why)
set -euo pipefail
src=$1
build=$2
python=$3
# shellcheck source=tests/package/clean_root.sh
. "$src/tests/package/clean_root.sh"
root_test worker_root
venv=$(cd "$(dirname "$python")/.." && pwd)
[ -f "$venv/pyvenv.cfg" ] || { say "SKIP: $python is not in a virtual environment to mount"; exit 77; }
torch_cuda=$("$python" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null) ||
  fail "$python cannot import torch"
toolkit=""
if [ -n "$torch_cuda" ]; then
  [ -x /usr/local/cuda/bin/nvcc ] ||
    { say "SKIP: torch is built with CUDA $torch_cuda and this machine has no toolkit to lend"; exit 77; }
  toolkit=$(readlink -f /usr/local/cuda)
fi
version=$(cat "$src/VERSION")
deb="$build/package/trainsup_${version}_$(dpkg --print-architecture).deb"
[ -f "$deb" ] || fail "$deb is missing (the package.deb test makes it)"

root="$build/worker-root"
make_clean_root "$root" "$build"
cp "$deb" "$root/tmp/trainsup.deb"
cp "$src/tests/package/small_worker_run.toml" "$root/tmp/spec.toml"

# Everything that mounts runs in namespaces of its own: a PID namespace
# (what the daemon starts dies with it) and a mount namespace (the mounts
# go with it, whatever fails).
log="$build/worker-root.log"
set +e
unshare --pid --fork --mount --propagation private bash -s "$root" "$src" "$venv" "$python" \
  "$toolkit" >"$log" 2>&1 <<'BOX'
set -euo pipefail
root=$1 src=$2 venv=$3 python=$4 toolkit=$5
# shellcheck source=tests/package/clean_root.sh
. "$src/tests/package/clean_root.sh"
step() { echo "== $*"; }
in_root() { chroot "$root" env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  DEBIAN_FRONTEND=noninteractive "$@"; }
ro_bind() { mkdir -p "$root$2"; mount --bind "$1" "$root$2"; mount -o remount,bind,ro "$root$2"; }
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
ro_bind "$src" /src
ro_bind "$venv" "$venv"

step "the box: Debian's python3, then the package"
in_root apt-get update -qq
in_root apt-get install -y -qq --no-install-recommends python3 /tmp/trainsup.deb >/dev/null
step "deploy/bootstrap.sh --worker-build-deps"
in_root bash /src/deploy/bootstrap.sh --worker-build-deps
if [ -n "$toolkit" ]; then
  step "deploy/build-worker.sh without the CUDA toolkit (must fail, naming it)"
  if in_root bash /src/deploy/build-worker.sh --python "$python" --build-dir /tmp/wb-no-toolkit \
    >/tmp/no-toolkit.log 2>&1; then
    cat /tmp/no-toolkit.log; echo "built against a CUDA torch without the toolkit"; exit 1
  fi
  grep -A4 'is built with' /tmp/no-toolkit.log
  tr -s ' \n' ' ' </tmp/no-toolkit.log | grep -q 'needs the CUDA toolkit (nvcc)' ||
    { cat /tmp/no-toolkit.log; echo "no message naming the toolkit"; exit 1; }
  ro_bind "$toolkit" "$toolkit"
  ln -sfn "$toolkit" "$root/usr/local/cuda"
fi
step "deploy/build-worker.sh --python $python"
in_root bash /src/deploy/build-worker.sh --python "$python" --build-dir /tmp/wb
in_root ldd /usr/local/bin/trainsup-worker | grep 'not found' && exit 1

step "the packaged trainsupd trains with that worker"
start_packaged_daemon
cp "$root/tmp/spec.toml" "$root/srv/trainsup/data/spec.toml"
id=$(as_trainsup trainctl --token-file /var/lib/trainsup/auth/operator.token --timeout 30 \
  submit /srv/trainsup/data/spec.toml)
set +e
as_trainsup trainctl --token-file /var/lib/trainsup/auth/viewer.token watch "$id"
watch_rc=$?
set -e
head -1 "$root/var/lib/trainsup/runs/$id/attempts/1/rank-0.log"
kill -TERM "$daemon"; wait "$daemon" || true
[ "$watch_rc" -eq 0 ] || { cat "$root/tmp/trainsupd.log" "$root"/var/lib/trainsup/runs/"$id"/attempts/*/rank-0.log; exit 1; }
BOX
rc=$?
set -e
cat "$log"
[ "$rc" -eq 0 ] || fail "the box's set-up or run failed (exit $rc)"
grep -q "^trainsup-worker $version (LibTorch .*) at /usr/local/bin/trainsup-worker\$" "$log" ||
  fail "the run's worker is not the one built into /usr/local/bin"
rm -rf "$root"
say "OK"
