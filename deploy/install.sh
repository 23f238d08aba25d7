#!/usr/bin/env bash
# Installs trainsup from a build directory as a systemd service
# (docs/operations.md):
#   PREFIX/bin/{trainsupd,trainctl,trainsup-worker}     binaries (PREFIX: /usr/local)
#   PREFIX/share/doc/trainsup/operations.md             the operator's guide
#   /etc/systemd/system/trainsupd.service               the unit (paths adapted to PREFIX)
#   /etc/trainsup/trainsupd.toml                        the config, only if there is none
#                                                       (else trainsupd.toml.dist beside it)
#   system user and group trainsup, in the video and render groups where they
#   exist (GPU device nodes); /srv/trainsup/data, the packaged data root
# checking the unit with systemd-analyze verify before it replaces the
# installed one, then runs systemctl daemon-reload. It does not enable or start the service. Idempotent: a
# second run changes nothing but the binaries, docs and unit it copies
# again.
#
# Usage: deploy/install.sh [--build-dir DIR] [--prefix DIR] [--dry-run]
#   --build-dir DIR  where the binaries were built (default: ./build); they
#                    are looked up in DIR/bin, DIR/supervisor and DIR/worker
#   --prefix DIR     installation prefix (default: /usr/local)
#   --dry-run        print what would be done, change nothing (no root needed)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
build_dir=build
prefix=/usr/local
dry_run=0
unit_path=/etc/systemd/system/trainsupd.service
config_dir=/etc/trainsup
data_root=/srv/trainsup/data
binaries=(trainsupd trainctl trainsup-worker)

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    --build-dir=*) build_dir=${1#*=}; shift ;;
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --dry-run|-n) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 64 ;;
  esac
done
case "$prefix" in
  /*) ;;
  *) echo "install.sh: --prefix must be an absolute path, not '$prefix'" >&2; exit 64 ;;
esac
prefix=${prefix%/}

# Prints a command, and runs it unless this is a dry run.
run() {
  if [ "$dry_run" -eq 1 ]; then
    printf 'would run:'; printf ' %q' "$@"; printf '\n'
  else
    printf '+'; printf ' %q' "$@"; printf '\n'
    "$@"
  fi
}
note() { echo "install.sh: $*"; }

if [ "$dry_run" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: must run as root (or try --dry-run)" >&2
  exit 1
fi

# -- binaries ------------------------------------------------------------------
missing=0
declare -A found
for name in "${binaries[@]}"; do
  found[$name]=""
  for dir in "$build_dir/bin" "$build_dir/supervisor" "$build_dir/worker" "$build_dir"; do
    if [ -f "$dir/$name" ] && [ -x "$dir/$name" ]; then found[$name]="$dir/$name"; break; fi
  done
  if [ -z "${found[$name]}" ]; then
    missing=1
    note "$name not found in $build_dir (build it first: cmake --build $build_dir --target $name)"
  fi
done
if [ "$missing" -eq 1 ] && [ "$dry_run" -eq 0 ]; then
  echo "install.sh: missing binaries; nothing installed" >&2
  exit 1
fi

run install -d -m 0755 "$prefix/bin"
for name in "${binaries[@]}"; do
  if [ -n "${found[$name]}" ]; then
    run install -m 0755 "${found[$name]}" "$prefix/bin/$name"
  else
    note "(dry run) would install $build_dir/.../$name to $prefix/bin/$name once built"
  fi
done
run install -d -m 0755 "$prefix/share/doc/trainsup"
run install -m 0644 "$repo/docs/operations.md" "$prefix/share/doc/trainsup/operations.md"

# -- user and groups -------------------------------------------------------------
if getent group trainsup >/dev/null; then
  note "group trainsup exists"
else
  run groupadd --system trainsup
fi
if getent passwd trainsup >/dev/null; then
  note "user trainsup exists"
else
  run useradd --system --gid trainsup --home-dir /var/lib/trainsup --no-create-home \
    --shell /usr/sbin/nologin --comment "trainsup training supervisor" trainsup
fi
# The NVIDIA and DRM device nodes belong to these groups on Debian; missing
# on machines without GPUs, which is fine.
gpu_groups=()
for group in video render; do
  if getent group "$group" >/dev/null; then gpu_groups+=("$group"); fi
done
if [ ${#gpu_groups[@]} -gt 0 ]; then
  gpu_list=$(IFS=,; echo "${gpu_groups[*]}")
  run usermod --append --groups "$gpu_list" trainsup
fi

# -- unit ------------------------------------------------------------------------
# The unit names /usr/local; another prefix is substituted into the copy
# that is verified (before anything replaces the installed unit) and then
# installed.
if [ "$prefix" != /usr/local ]; then
  note "the unit's ExecStart= and Documentation= get $prefix instead of /usr/local"
fi
if [ "$dry_run" -eq 1 ]; then
  unit_source="$here/trainsupd.service"
else
  staging=$(mktemp -d)
  trap 'rm -rf "$staging"' EXIT
  unit_source="$staging/trainsupd.service"
  sed -e "s|/usr/local/bin/|$prefix/bin/|g" -e "s|/usr/local/share/doc/|$prefix/share/doc/|g" \
    "$here/trainsupd.service" >"$unit_source"
fi
if command -v systemd-analyze >/dev/null 2>&1; then
  run systemd-analyze verify "$unit_source"
else
  note "systemd-analyze not found; unit not verified"
fi
run install -m 0644 "$unit_source" "$unit_path"

# -- config and data root ----------------------------------------------------------
run install -d -m 0755 "$config_dir"
if [ -e "$config_dir/trainsupd.toml" ]; then
  if cmp -s "$here/trainsupd.toml" "$config_dir/trainsupd.toml"; then
    note "$config_dir/trainsupd.toml is the packaged one; unchanged"
  else
    note "keeping $config_dir/trainsupd.toml; the packaged one goes to trainsupd.toml.dist"
    run install -m 0644 "$here/trainsupd.toml" "$config_dir/trainsupd.toml.dist"
  fi
else
  # Group-readable only: the file may name token files and TLS keys.
  run install -m 0640 -o root -g trainsup "$here/trainsupd.toml" "$config_dir/trainsupd.toml"
fi
if [ -d "$data_root" ]; then
  note "$data_root exists"
else
  run install -d -m 2775 -o root -g trainsup "$data_root"
fi

# -- systemd ---------------------------------------------------------------------
if [ -d /run/systemd/system ]; then
  run systemctl daemon-reload
else
  note "systemd is not running here; skipping daemon-reload"
fi

if [ "$dry_run" -eq 1 ]; then
  note "dry run: nothing was changed"
else
  note "installed. Edit $config_dir/trainsupd.toml (data_roots), then: systemctl enable --now trainsupd"
fi
