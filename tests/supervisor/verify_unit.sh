#!/usr/bin/env bash
# Verifies a systemd unit with `systemd-analyze verify` without installing
# it: a copy (same file name, so messages name it the same way) gets
# ExecStart= and ExecReload= rewritten to /bin/true, since verify rejects a
# command that does not exist. Fails on any message that names the unit;
# other messages (a container without a running systemd prints some about
# unrelated units) are shown but ignored. Exits 77 (skip) without
# systemd-analyze.
# Usage: verify_unit.sh path/to/unit.service
set -euo pipefail

unit=${1:?usage: verify_unit.sh UNIT_FILE}
[ -f "$unit" ] || { echo "verify_unit: $unit: no such file" >&2; exit 1; }
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "verify_unit: systemd-analyze not found; skipping"
  exit 77
fi

name=$(basename "$unit")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed -e 's|^ExecStart=.*|ExecStart=/bin/true|' \
    -e 's|^ExecReload=.*|ExecReload=/bin/true|' "$unit" >"$dir/$name"
# The rewrite must have happened, or verify would test something else.
grep -q '^ExecStart=/bin/true$' "$dir/$name" || { echo "verify_unit: $name has no ExecStart=" >&2; exit 1; }

# verify exits 0 on warnings such as an unknown key; its output is what counts.
output=$(cd "$dir" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify "./$name" 2>&1) || status=$?
[ -n "$output" ] && printf '%s\n' "$output"
ours=$(printf '%s\n' "$output" | grep -F -- "$name" || true)
if [ -n "$ours" ]; then
  echo "verify_unit: FAIL: systemd-analyze complained about $name:" >&2
  printf '%s\n' "$ours" >&2
  exit 1
fi
if [ "${status:-0}" -ne 0 ] && [ -z "$output" ]; then
  echo "verify_unit: FAIL: systemd-analyze exited ${status} without a message" >&2
  exit 1
fi
echo "verify_unit: $name verifies"
