# shellcheck shell=bash
# Sourced by the package tests that need a clean Debian 12 root
# (debian_root.sh, worker_root.sh).
#
# root_test NAME names the test in say's and fail's lines, and skips it
# (exit 77) where it cannot run: not root, or no debootstrap, unshare, chroot.
test_name=package
say() { echo "$test_name: $*"; }
fail() { echo "$test_name: FAIL: $*" >&2; exit 1; }
root_test() {
  test_name=$1
  if [ "$(id -u)" -ne 0 ]; then say "SKIP: needs root (debootstrap, chroot, mounts)"; exit 77; fi
  local tool
  for tool in debootstrap unshare chroot; do
    command -v "$tool" >/dev/null || fail "$tool is missing (deploy/bootstrap.sh installs it)"
  done
}

# make_clean_root ROOT BUILD_DIR makes ROOT
# a minimal bookworm with systemd (a training box's init), from
# BUILD_DIR/debian-root-base.tar when an earlier run left it, else by
# debootstrap from Debian's mirror (then the tarball is written for the next
# run).
make_clean_root() {
  local root=$1 build=$2
  local base="$build/debian-root-base.tar" mirror=http://deb.debian.org/debian
  rm -rf "$root"
  mkdir -p "$root"
  if [ -f "$base" ]; then
    say "clean root from $base (made by an earlier run)"
    tar -C "$root" -xf "$base"
  else
    say "debootstrap --variant=minbase bookworm ($mirror)"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$build/debian-root-debootstrap.log" 2>&1 ||
      { tail -20 "$build/debian-root-debootstrap.log" >&2; fail "debootstrap failed"; }
    # The machine's own sources (with updates and security), as on a real box.
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      rm -f "$root/etc/apt/sources.list"
      cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
    fi
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    # A training box runs systemd; minbase has none. Installed before the
    # package, so the package's scripts meet it as on a real box.
    say "apt-get install systemd (a box's init)"
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      systemd >"$build/debian-root-systemd.log" 2>&1 ||
      { tail -30 "$build/debian-root-systemd.log" >&2; fail "apt-get install systemd failed"; }
    tar -C "$root" -cf "$base.$$.tmp" . && mv "$base.$$.tmp" "$base"
  fi
  cp /etc/resolv.conf "$root/etc/resolv.conf"
}

# In ROOT ($root) with the package installed: as_trainsup runs a command
# there as the trainsup user, and start_packaged_daemon starts the packaged
# trainsupd that way on the packaged configuration (its log
# ROOT/tmp/trainsupd.log, its pid in $daemon), then waits for its socket
# and operator token.
as_trainsup() { chroot --userspec=trainsup:trainsup "$root" "$@"; }
start_packaged_daemon() {
  chroot "$root" install -d -m 0750 -o trainsup -g trainsup /run/trainsup
  as_trainsup /usr/bin/trainsupd --config /etc/trainsup/trainsupd.toml >"$root/tmp/trainsupd.log" 2>&1 &
  # shellcheck disable=SC2034 # the caller stops it
  daemon=$!
  for _ in $(seq 1 100); do
    [ -S "$root/run/trainsup/trainsupd.sock" ] && [ -s "$root/var/lib/trainsup/auth/operator.token" ] && break
    sleep 0.1
  done
}
