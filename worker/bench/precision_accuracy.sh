#!/usr/bin/env bash
# The demo's held-out mIoU trained at each precision (issue 44): the demo's
# spec (deploy/demo.sh, without its injected crash) run by the real
# trainsup-worker, on its own, once per train.precision, with the same
# seed and steps; prints each run's final validation mIoU, accuracy and
# time from its exit file, and the differences from fp32.
# Usage: worker/bench/precision_accuracy.sh [BUILD_DIR] [STEPS] [PRECISIONS]
#   defaults: build, 100 (the demo's), "fp32 bf16"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build}
steps=${2:-100}
precisions=${3:-fp32 bf16}
data="$root/data/samples/urban.las"
[[ -f $data ]] || { echo "precision_accuracy: $data is missing (deploy/fetch-sample-data.sh)" >&2; exit 1; }
work=$(mktemp -d /tmp/trainsup_precision.XXXXXX)
trap 'rm -rf "$work"' EXIT
for p in $precisions; do
  dir="$work/$p"
  mkdir -p "$dir"
  cat >"$dir/spec.toml" <<TOML
name = "demo-$p"
[model]
arch = "minkunet14"
in_channels = 2
voxel_size = 0.5
height_feature = true
[data]
format = "las"
path = "$data"
val_fraction = 0.25
use_features = false
tile_size = 20
[optimizer]
kind = "sgd"
lr = 0.05
[train]
batch_size = 4
steps = $steps
checkpoint_every_steps = 0
threads = 2
precision = "$p"
TOML
  start=$(date +%s.%N)
  OMP_WAIT_POLICY=PASSIVE "$build/bin/trainsup-worker" --run-dir "$dir" --rank 0 --world-size 1 \
    --attempt 1 --supervisor "" --resume none >"$dir/worker.log" 2>&1 ||
    { echo "precision_accuracy: the $p run failed:" >&2; tail -5 "$dir/worker.log" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 - "$dir/attempts/1/rank-0.exit.json" "$p" "$start" "$end" "$dir/worker.log" <<'PY'
import json, re, sys
path, p, start, end, log = sys.argv[1:6]
e = json.load(open(path))
text = open(log).read()
m = re.search(r"val mIoU ([0-9.]+)", e.get("message", "")) or re.search(r"val mIoU ([0-9.]+)", text)
line = [l for l in text.splitlines() if "precision " + p + ":" in l]
print("%s: exit %d, %s; %.1f s" % (p, e["code"], e["message"][:160], float(end) - float(start)))
if line:
    print("   " + line[0][line[0].index("precision "):][:160])
PY
done
