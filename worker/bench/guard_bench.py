#!/usr/bin/env python3
"""What the training guard costs, and whether its default spike factor fires
on ordinary training (docs/guard.md, docs/benchmarks.md).

Runs the real trainsup-worker standalone on the demo's data (urban.las,
MinkUNet14, batch 4, 2 intra-op threads: the spec's train.threads, which the
worker applies with at::set_num_threads), alternating runs with the guard
on (the defaults) and off (guard.check_finite = false, spike_factor = 0),
and prints the median per-step iteration time of each and their ratio.
Every run of a pair uses the same spec but for [guard], so the two do the
same steps with the same kernels and allocator settings.

Then it reads the guard-on runs' (and, with --long STEPS, one longer run's)
per-step losses and reports how many steps the guard rejected, and the
largest ratio of a step's loss to the median of the previous spike_window
applied losses after the warm-up: the margin under spike_factor.

  python3 worker/bench/guard_bench.py [--worker build/bin/trainsup-worker]
      [--steps 60] [--pairs 3] [--long 2000]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP = re.compile(r"^step (\d+)/\d+ epoch \d+ loss (\S+) .*; iteration ([0-9.]+) ms", re.M)
THREADS = re.compile(r", (\d+) threads, on (\S+)")

# deploy/demo.sh's run spec without its [testing] fault, checkpoints or
# evaluation (keep the two in step).
SPEC = """name = "guard-bench"
[model]
arch = "minkunet14"
in_channels = 2
voxel_size = 0.5
height_feature = true
[data]
format = "las"
path = "{data}"
val_fraction = 0.25
use_features = false
tile_size = 20
[optimizer]
kind = "sgd"
lr = 0.05
[train]
batch_size = 4
steps = {steps}
checkpoint_every_steps = 0
eval_every_steps = 0
threads = 2
{guard}"""

GUARD_OFF = "[guard]\ncheck_finite = false\nspike_factor = 0\n"


def run(worker, steps, guard):
    d = tempfile.mkdtemp(prefix="guard-bench-")
    try:
        with open(os.path.join(d, "spec.toml"), "w") as f:
            f.write(SPEC.format(data=os.path.join(ROOT, "data/samples/urban.las"), steps=steps,
                                guard=guard))
        r = subprocess.run([worker, "--run-dir", d, "--rank", "0", "--world-size", "1",
                            "--attempt", "1", "--supervisor", "", "--resume", "none"],
                           capture_output=True, text=True,
                           env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
        log = r.stdout + r.stderr
        if r.returncode != 0:
            sys.exit("the worker failed (exit %d):\n%s" % (r.returncode, log[-3000:]))
        return log
    finally:
        shutil.rmtree(d, ignore_errors=True)


def spike_margin(losses, window=50, warmup=20):
    """The largest loss / median(previous `window` losses) after `warmup`."""
    worst = (0.0, 0)
    for i in range(warmup, len(losses)):
        median = statistics.median(losses[max(0, i - window):i])
        if median > 0 and losses[i] / median > worst[0]:
            worst = (losses[i] / median, i + 1)
    return worst


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", default=os.path.join(ROOT, "build/bin/trainsup-worker"))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--long", type=int, default=0, help="steps of one more guard-on run")
    a = p.parse_args()
    on, off, logs = [], [], []
    for k in range(a.pairs):
        # Alternate which goes first, so drift on a shared machine falls on both.
        for guarded in ((True, False) if k % 2 == 0 else (False, True)):
            log = run(a.worker, a.steps, "" if guarded else GUARD_OFF)
            times = [float(m.group(3)) for m in STEP.finditer(log)][5:]  # warm-up steps out
            (on if guarded else off).extend(times)
            if guarded:
                logs.append(log)
    threads = THREADS.search(logs[0])
    print("guard_bench: %d pairs of %d-step runs, MinkUNet14 on urban.las, batch 4, %s "
          "intra-op threads (train.threads), on %s" %
          (a.pairs, a.steps, threads.group(1) if threads else "?",
           threads.group(2) if threads else "?"))
    m_on, m_off = statistics.median(on), statistics.median(off)
    print("  median iteration: guard on %.1f ms, off %.1f ms (%d and %d steps): on/off = %.4f" %
          (m_on, m_off, len(on), len(off), m_on / m_off))
    if a.long > 0:
        logs.append(run(a.worker, a.long, ""))
    for i, log in enumerate(logs):
        losses = [float(m.group(2)) for m in STEP.finditer(log)]
        rejected = log.count(" not applied (")
        ratio, at = spike_margin(losses)
        print("  %s: %d steps, %d not applied, largest loss / median of the 50 before: %.2f "
              "(step %d; spike_factor 6)" %
              ("long run" if a.long > 0 and i == len(logs) - 1 else "guard-on run %d" % (i + 1),
               len(losses), rejected, ratio, at))


if __name__ == "__main__":
    main()
