#!/usr/bin/env bash
# Runs deploy/install.sh --dry-run against a build directory and checks that
# it succeeds, names the unit it would install, and says it changed nothing.
# Usage: install_dry_run.sh path/to/install.sh BUILD_DIR
set -euo pipefail
script=${1:?usage: install_dry_run.sh INSTALL_SH BUILD_DIR}
build_dir=${2:?usage: install_dry_run.sh INSTALL_SH BUILD_DIR}

output=$(bash "$script" --dry-run --build-dir "$build_dir" 2>&1) || {
  status=$?
  printf '%s\n' "$output"
  echo "install_dry_run: FAIL: install.sh --dry-run exited $status" >&2
  exit 1
}
printf '%s\n' "$output"
for expected in "/etc/systemd/system/trainsupd.service" "/etc/trainsup/trainsupd.toml" \
                "dry run: nothing was changed"; do
  if ! grep -qF -- "$expected" <<<"$output"; then
    echo "install_dry_run: FAIL: output does not mention '$expected'" >&2
    exit 1
  fi
done
# Every action must be reported as "would run", none executed ("+ cmd").
if grep -q '^+ ' <<<"$output"; then
  echo "install_dry_run: FAIL: a command was run during --dry-run" >&2
  exit 1
fi
echo "install_dry_run: ok"
