#!/usr/bin/env bash
# lintian on the Debian package: no error, and every warning or
# informational tag kept is listed with its reason in lintian-allowed.txt
# ("TAG  # reason" per line). A listed tag that no longer appears fails too,
# so the list only shrinks.
# Usage: lintian.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
fail() { echo "lintian: FAIL: $*" >&2; exit 1; }
command -v lintian >/dev/null || fail "lintian is missing (deploy/bootstrap.sh installs it)"
deb="$build/package/trainsup_$(cat "$src/VERSION")_$(dpkg --print-architecture).deb"
[ -f "$deb" ] || fail "$deb is missing (the package.deb test makes it)"

# lintian refuses to run as root unless told.
out=$(lintian --allow-root --tag-display-limit 0 --display-info "$deb" 2>&1) || true
echo "$out"
errors=$(grep -E '^E: ' <<<"$out" || true)
[ -z "$errors" ] || fail "errors: $errors"
seen=$( (grep -E '^[WI]: ' <<<"$out" || true) | awk '{print $3}' | sort -u)
allowed=$(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$src/tests/package/lintian-allowed.txt" | grep -v '^$' | sort -u)
new=$(comm -23 <(echo "$seen" | grep -v '^$') <(echo "$allowed") || true)
stale=$(comm -13 <(echo "$seen" | grep -v '^$') <(echo "$allowed") || true)
[ -z "$new" ] || fail "tags not in tests/package/lintian-allowed.txt: $new"
[ -z "$stale" ] || fail "tests/package/lintian-allowed.txt lists tags lintian no longer gives: $stale"
echo "lintian: OK, no error; $(grep -c '^W: ' <<<"$out" || true) warnings," \
  "$(grep -c '^I: ' <<<"$out" || true) informational tags, each listed with its reason"
