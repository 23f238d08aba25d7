#!/usr/bin/env bash
# ctest's gpu.e2e_cpu_only (tests/gpu/CMakeLists.txt): prepare-e2e.sh
# --main-torch into DIR, then e2e.sh --cpu-only on DIR/trainsup.tar.xz,
# logs in DIR/logs. Exit 77 (skipped) without the sample scan, which
# deploy/fetch-sample-data.sh fetches; else e2e.sh's status.
# Usage: tests/gpu/e2e_cpu_only_test.sh DIR
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:?usage: e2e_cpu_only_test.sh DIR}
if [[ ! -f $root/data/samples/urban.las ]]; then
  echo "skipped: $root/data/samples/urban.las is missing (deploy/fetch-sample-data.sh)"
  exit 77
fi
rm -rf "$dir"
mkdir -p "$dir"
"$root/tests/gpu/prepare-e2e.sh" --main-torch --out "$dir" || exit 1
bash "$root/tests/gpu/e2e.sh" --cpu-only --bundle "$dir/trainsup.tar.xz" --logs "$dir/logs"
status=$?
for f in "$dir"/logs/*/result.json; do
  [[ -f $f ]] && echo "$f: $(tr -d '\n' <"$f")"
done
exit $status
