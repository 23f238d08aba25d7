#!/usr/bin/env python3
"""The table of kernel_sets_report.sh from the JSON it kept.

    python3 sparse/bench/kernel_sets_report.py OUT_DIR SET [SET ...]

Medians over the runs (ranges in brackets). The convolution ratios are
against the BLAS path measured in the same program run (sparse_bench);
the MinkUNet ratios are the median of run i of a set against run i of its
BLAS path, two programs run next to each other, never against a figure
from another day.
"""
import glob
import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def med(values):
    return statistics.median(values) if values else float("nan")


def spread(values, fmt):
    if len(values) < 2:
        return ""
    return " (" + fmt % min(values) + "–" + fmt % max(values) + ")"


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: kernel_sets_report.py OUT_DIR SET [SET ...]")
    out, sets = sys.argv[1], sys.argv[2:]
    before = load(os.path.join(out, "fma_peak-before.json"))
    after = load(os.path.join(out, "fma_peak-after.json"))
    lines = []
    say = lines.append
    say("FMA ceiling (fma_peak, %d threads), before / after the benchmarks:" % before["threads"])
    for s in ("avx2", "avx512"):
        key = s + "_gflops"
        if key in before and key in after:
            say("  %-7s %.1f / %.1f GFLOP/s" % (s, before[key], after[key]))
    say("")
    cases = [("conv3_s1_c64", "conv C64 3×3×3"), ("conv3_s1_c32", "conv C32 3×3×3"),
             ("conv2_s2_c64", "k2 s2 downsample C64, map cached")]
    for s in sets:
        runs = [load(p) for p in sorted(glob.glob(os.path.join(out, "sparse_bench-%s-*.json" % s)))]
        unet = {k: [load(p) for p in sorted(glob.glob(
            os.path.join(out, "minkunet_bench-%s-%s-*.json" % (s, k))))] for k in (s, "blas")}
        if not runs:
            continue
        ran = sorted({r["kernel_set"] for r in runs})
        say("### %s set (ran: %s; OpenBLAS %s kernels; %d sparse_bench runs, %d minkunet_bench "
            "runs per side)" % (s, ", ".join(ran), runs[0]["blas_core"], len(runs),
                                 len(unet[s])))
        say("")
        say("| figure | %s set | BLAS path | ratio |" % s)
        say("|---|---|---|---|")
        say("| 3×3×3 kernel map | %.2f ms%s | | |" % (
            med([r["kernel_map_ms"] for r in runs]),
            spread([r["kernel_map_ms"] for r in runs], "%.2f")))
        for key, name in cases:
            for part, label in (("fwd", "fwd"), ("fwdbwd", "fwd+bwd")):
                got = [r["%s_%s_ms" % (key, part)] for r in runs]
                blas = [r["%s_blas_%s_ms" % (key, part)] for r in runs]
                ratio = [r["%s_%s_speedup_vs_blas" % (key, part)] for r in runs]
                say("| %s %s | %.1f ms | %.1f ms | %.2f×%s |" % (
                    name, label, med(got), med(blas), med(ratio), spread(ratio, "%.2f")))
        for side, want in ((s, s), ("blas", "blas")):
            wrong = sorted({u["conv_kernels"] for u in unet[side]} - {want})
            if wrong:
                sys.exit("kernel_sets_report: minkunet_bench for %s ran the %s kernels" %
                         (side, ", ".join(wrong)))
        for key, label in (("minkunet14_plain_step_s", "MinkUNet14 fwd+bwd (runs side by side)"),
                           ("minkunet14_forward_s", "MinkUNet14 fwd, no gradients (same)")):
            got = [u[key] for u in unet[s]]
            blas = [u[key] for u in unet["blas"]]
            if not got or len(got) != len(blas):
                continue
            ratio = [b / g for g, b in zip(got, blas)]
            say("| %s | %.2f s%s | %.2f s%s | %.2f×%s |" % (
                label, med(got), spread(got, "%.2f"), med(blas), spread(blas, "%.2f"),
                med(ratio), spread(ratio, "%.2f")))
        say("")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
