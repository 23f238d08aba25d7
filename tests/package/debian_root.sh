#!/usr/bin/env bash
# The Debian package in a clean Debian 12 root (issue 27): debootstrap makes
# a minimal bookworm, apt installs the .deb there with its dependencies
# resolved from Debian, and in it
#   * postinst made the trainsup user, group and directories with their modes;
#   * systemd-analyze verify passes on the installed unit;
#   * trainsupd runs as the trainsup user on the packaged configuration (an
#     operator allows /usr/bin/python3, as docs/operations.md says), and the
#     packaged trainctl submits a [command] run of a python3 script that
#     imports the installed client, crashes once, resumes from its verified
#     checkpoint and succeeds;
#   * purge leaves only what Debian policy allows: the system user and group
#     (the changed passwd, group and shadow files and their backups).
# Needs root and Debian's mirror (the machine's apt sources); minutes.
# Usage: debian_root.sh SOURCE_DIR BUILD_DIR     (exit 77: skipped, with why)
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/package/clean_root.sh
. "$src/tests/package/clean_root.sh"
root_test debian_root

version=$(cat "$src/VERSION")
deb="$build/package/trainsup_${version}_$(dpkg --print-architecture).deb"
[ -f "$deb" ] || fail "$deb is missing (the package.deb test makes it)"
root="$build/debian-root"

# -- a clean bookworm with systemd ----------------------------------------------
in_root() { chroot "$root" "$@"; }
make_clean_root "$root" "$build"

# What the root holds before the package, apart from what changes anyway.
listing() {
  (cd "$root" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./run -o \
    -path ./tmp -o -path ./var/cache -o -path ./var/log -o -path ./var/lib/apt -o \
    -path ./var/lib/dpkg -o -path ./etc/resolv.conf -o -path ./etc/ld.so.cache \) -prune -o -print |
    sort)
}
listing >"$build/debian-root-before.txt"

# -- install -------------------------------------------------------------------------
# A state directory left with the wrong owner and mode (issue 42, 14): the
# package's postinst sets them.
install -d -m 0777 "$root/var/lib/trainsup"
cp "$deb" "$root/tmp/"
say "apt-get install ./$(basename "$deb")"
in_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "/tmp/$(basename "$deb")" >"$build/debian-root-install.log" 2>&1 ||
  { tail -30 "$build/debian-root-install.log" >&2; fail "apt-get install of the package failed"; }
in_root dpkg-query -W -f='${Status} ${Version}\n' trainsup | grep -qx "install ok installed $version" ||
  fail "trainsup is not installed: $(in_root dpkg-query -W trainsup)"

# postinst: user, group, directories and modes (docs/operations.md).
in_root getent passwd trainsup | grep -q ':/var/lib/trainsup:/usr/sbin/nologin$' ||
  fail "no system user trainsup: $(in_root getent passwd trainsup || true)"
check_mode() {
  local got
  got=$(in_root stat -c '%a %U:%G' "$1")
  [ "$got" = "$2" ] || fail "$1 is $got, docs/operations.md says $2"
}
check_mode /var/lib/trainsup "750 trainsup:trainsup"
check_mode /srv/trainsup/data "2770 root:trainsup-data"
in_root id -nG trainsup | tr ' ' '\n' | grep -qx trainsup-data ||
  fail "the trainsup user cannot read the data root: not in group trainsup-data"
check_mode /etc/trainsup/trainsupd.toml "640 root:trainsup"
in_root trainsupd --version | grep -qx "trainsupd $version" || fail "trainsupd --version"
in_root trainctl --version | grep -qx "trainctl $version" || fail "trainctl --version"
in_root python3 -c "import trainsup; assert trainsup.__version__ == '$version'" ||
  fail "Debian's python3 cannot import the packaged client"
[ -z "$(in_root find /etc/systemd -name 'trainsupd*')" ] || fail "the package enabled the unit"

# systemd-analyze verify on the installed unit, by the root's own systemd.
in_root systemd-analyze verify /lib/systemd/system/trainsupd.service ||
  fail "systemd-analyze verify failed on the installed unit"
say "systemd-analyze verify: OK"

# -- the daemon, a script run that crashes once -------------------------------------------
# The operator allows Debian's python3 (docs/operations.md, "Running users'
# scripts"), and the script lives under the packaged data root.
sed -i 's|^# allowed_programs = \["/usr/bin/python3"\]|allowed_programs = ["/usr/bin/python3"]|' \
  "$root/etc/trainsup/trainsupd.toml"
grep -q '^allowed_programs = \["/usr/bin/python3"\]' "$root/etc/trainsup/trainsupd.toml" ||
  fail "the packaged config has no allowed_programs line to enable"
job=/srv/trainsup/data/job
install -d "$root$job"
cp "$src/tests/package/train_without_torch.py" "$root$job/train.py"
cat >"$root$job/spec.toml" <<SPEC
name = "packaged-script"
[command]
argv = ["/usr/bin/python3", "$job/train.py"]
cwd = "$job"
heartbeats = true
total_steps = 20
SPEC
in_root chown -R trainsup:trainsup "$job"

# In namespaces of their own: a PID namespace (everything the daemon starts
# dies with it), a mount namespace for /proc and /dev, and a network
# namespace so the packaged metrics port cannot collide with the host's.
say "trainsupd as trainsup; trainctl submit, trainctl watch"
set +e
unshare --pid --fork --mount --net --propagation private bash -s "$root" "$src" \
  >"$build/debian-root-run.log" 2>&1 <<'RUN'
set -u
root=$1
# shellcheck source=tests/package/clean_root.sh
. "$2/tests/package/clean_root.sh"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
ip link set lo up
start_packaged_daemon
id=$(as_trainsup trainctl --token-file /var/lib/trainsup/auth/operator.token --timeout 30 \
  submit /srv/trainsup/data/job/spec.toml)
echo "submitted $id"
as_trainsup trainctl --token-file /var/lib/trainsup/auth/viewer.token watch "$id"
watch_rc=$?
as_trainsup trainctl --token-file /var/lib/trainsup/auth/viewer.token describe "$id" -o json \
  >"$root/tmp/describe.json"
for rank_log in "$root"/var/lib/trainsup/runs/"$id"/attempts/*/rank-0.log; do
  echo "== $rank_log"; cat "$rank_log"
done
kill -TERM "$daemon"; wait "$daemon"
echo "== trainsupd"; cat "$root/tmp/trainsupd.log"
exit "$watch_rc"
RUN
rc=$?
set -e
cat "$build/debian-root-run.log"
[ "$rc" -eq 0 ] || fail "trainctl watch exited $rc (the run did not succeed)"
python3 "$src/tests/package/check_history.py" "$root/tmp/describe.json" ||
  fail "the run's history is not one crash and a resume"
grep -q "resumed from step 10" "$build/debian-root-run.log" || fail "the script did not resume from step 10"
grep -q "trainsup client $version from /usr/lib/python3/dist-packages/trainsup" \
  "$build/debian-root-run.log" || fail "the script did not import the packaged client"
say "the run crashed once, resumed from step 10 and succeeded"

# -- purge ---------------------------------------------------------------------------
rm -rf "${root:?}$job"
in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq trainsup >"$build/debian-root-purge.log" 2>&1 ||
  { cat "$build/debian-root-purge.log" >&2; fail "apt-get purge failed"; }
in_root env DEBIAN_FRONTEND=noninteractive apt-get autoremove --purge -y -qq >>"$build/debian-root-purge.log" 2>&1
listing >"$build/debian-root-after.txt"
left=$(comm -13 "$build/debian-root-before.txt" "$build/debian-root-after.txt" |
  grep -vxE '\./etc/(passwd|group|shadow|gshadow)-' || true)
gone=$(comm -23 "$build/debian-root-before.txt" "$build/debian-root-after.txt" || true)
[ -z "$left" ] || fail "purge left: $left"
[ -z "$gone" ] || fail "install and purge removed what was there before: $gone"
in_root getent passwd trainsup >/dev/null || fail "purge removed the trainsup user (Debian keeps system users)"
say "purge left only the trainsup user and group"
rm -rf "$root"
say "OK"
