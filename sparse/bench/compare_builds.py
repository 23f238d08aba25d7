#!/usr/bin/env python3
"""The engine in two builds side by side (say, against two LibTorches):
minkunet_bench and sparse_bench of BUILD_A and BUILD_B, run in turn on the
same machine, scene and thread count, the order alternated every round
(A B, B A, ...), each program's --json kept. Prints a Markdown table of the
medians per figure and the ratio B / A (below 1: B is faster).

Usage: compare_builds.py BUILD_A BUILD_B [--rounds N] [--threads T]
                         [--out DIR] [--label-a NAME] [--label-b NAME]

Both builds' programs run with OMP_WAIT_POLICY=PASSIVE (as the worker and
the tests) and LibTorch's intra-op thread count set by --threads."""

import argparse
import json
import os
import statistics
import subprocess
import sys

MINKUNET_KEYS = ["minkunet14_forward_s", "minkunet14_plain_step_s",
                 "minkunet14_checkpointed_step_s"]
SPARSE_KEYS = ["kernel_map_ms", "conv3_s1_c32_fwd_ms", "conv3_s1_c32_fwdbwd_ms",
               "conv3_s1_c64_fwd_ms", "conv3_s1_c64_fwdbwd_ms", "conv3_s1_c64_blas_fwdbwd_ms",
               "conv2_s2_c64_fwd_ms", "conv2_s2_c64_fwdbwd_ms"]


def run(binary, args, env):
    out = subprocess.run([binary] + args + ["--json"], capture_output=True, text=True, env=env,
                         check=True).stdout
    # The JSON object is the last line that parses.
    for line in reversed(out.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise RuntimeError(f"{binary}: no JSON in its output")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_a")
    ap.add_argument("build_b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    a = ap.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    programs = [
        ("minkunet_bench", ["--depths", "14", "--repeats", "3", "--threads", str(a.threads)],
         MINKUNET_KEYS),
        ("sparse_bench", ["--threads", str(a.threads)], SPARSE_KEYS),
    ]
    results = {a.build_a: {}, a.build_b: {}}
    runs = []
    for r in range(a.rounds):
        order = [a.build_a, a.build_b] if r % 2 == 0 else [a.build_b, a.build_a]
        for name, args, _ in programs:
            for build in order:
                j = run(os.path.join(build, "sparse", name), args, env)
                results[build].setdefault(name, []).append(j)
                runs.append({"round": r, "build": build, "program": name, "result": j})
                print(f"round {r + 1}/{a.rounds}: {name} in {build} done", file=sys.stderr)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "compare_builds.json"), "w") as f:
            json.dump(runs, f, indent=1)
    print(f"| figure | {a.label_a} (median of {a.rounds}) | {a.label_b} (median of {a.rounds}) "
          f"| {a.label_b} / {a.label_a} |")
    print("|---|---|---|---|")
    for name, _, keys in programs:
        for key in keys:
            va = [j[key] for j in results[a.build_a][name] if key in j]
            vb = [j[key] for j in results[a.build_b][name] if key in j]
            if not va or not vb:
                continue
            ma, mb = statistics.median(va), statistics.median(vb)
            print(f"| {name} {key} | {ma:.4g} | {mb:.4g} | {mb / ma:.3f} |")
    first = {b: results[b]["sparse_bench"][0] for b in results}
    for b, label in ((a.build_a, a.label_a), (a.build_b, a.label_b)):
        j = first[b]
        print(f"\n{label}: {b}: threads {j.get('threads')}, kernel set {j.get('kernel_set')}, "
              f"BLAS {j.get('blas_core')} ({j.get('blas_library')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
