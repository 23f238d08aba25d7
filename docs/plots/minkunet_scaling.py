#!/usr/bin/env python3
"""MinkUNet step time and peak memory against scene size, as PNG plots.

Reads the JSON objects that `minkunet_bench --json` prints (one file per
scene size, e.g. from docs/plots/run_minkunet_scaling.sh) and draws, with
gnuplot (Debian: gnuplot-nox, in deploy/bootstrap.sh; Debian's
python3-matplotlib cannot be installed beside the project's Boost 1.81),
two plots for one depth:

  <out>/minkunet<depth>-step-time.png    training step, checkpointing off / on
  <out>/minkunet<depth>-peak-memory.png  peak memory above the model, off / on

    python3 docs/plots/minkunet_scaling.py [--depth 14] [--out docs/plots] FILE.json...

Standard library only; run by hand (it is not part of the test suite).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def load(paths, depth):
    rows = []
    key = "minkunet%d" % depth
    for path in paths:
        with open(path) as f:
            text = f.read().strip()
        # The JSON object is the last line (the bench prints nothing else
        # with --json, but tolerate a preceding log line).
        obj = json.loads(text.splitlines()[-1])
        if key + "_plain_step_s" not in obj:
            sys.exit("%s: no %s figures (run minkunet_bench --depths %d --json)" % (path, key, depth))
        rows.append({
            "scene": obj.get("scene", os.path.basename(path)),
            "voxels": obj["voxels"],
            "off_s": obj[key + "_plain_step_s"],
            "on_s": obj[key + "_checkpointed_step_s"],
            "off_mib": obj[key + "_plain_peak_mib"],
            "on_mib": obj[key + "_checkpointed_peak_mib"],
            "kernels": obj.get("conv_kernels", "?"),
            "threads": obj.get("threads", "?"),
            "blas": obj.get("blas_core", "?"),
        })
    rows.sort(key=lambda r: r["voxels"])
    return rows


def plot(rows, depth, out):
    kernels = sorted({r["kernels"] for r in rows})
    threads = sorted({str(r["threads"]) for r in rows})
    blas = sorted({r["blas"] for r in rows})
    subtitle = "%s kernels, %s threads, BLAS %s" % ("/".join(kernels), "/".join(threads), "/".join(blas))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        with open(data, "w") as f:
            for r in rows:
                f.write("%d %g %g %g %g \"%s\"\n" % (r["voxels"], r["off_s"], r["on_s"], r["off_mib"],
                                                     r["on_mib"], r["scene"]))
        common = """
set terminal pngcairo size 900,560 font "sans,11"
set key top left
set grid
set logscale xy
set xlabel "scene size (voxels at 2 cm)"
set format x "%.0s%c"
set pointsize 1.2
"""
        # One plot per figure: (file, title, y label, data column off; on is the next).
        figures = [
            ("step-time", "MinkUNet{d} training step (forward + backward), median\\n{sub}", "seconds", 2),
            ("peak-memory", "MinkUNet{d} peak memory of a training step above the model\\n"
             "(activations and parameter gradients; counting allocator)", "MiB", 4),
        ]
        script = common
        for name, title, ylabel, col in figures:
            script += """
set output "{out}/minkunet{d}-{name}.png"
set title "{title}"
set ylabel "{ylabel}"
plot "{data}" using 1:{off} with linespoints lw 2 pt 7 title "checkpointing off", \\
     "{data}" using 1:{on} with linespoints lw 2 pt 5 title "checkpointing on", \\
     "{data}" using 1:{off}:6 with labels offset 0,1.2 notitle
""".format(out=out, d=depth, name=name, title=title.format(d=depth, sub=subtitle), ylabel=ylabel,
           data=data, off=col, on=col + 1)
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    for r in rows:
        print("%-8s %9d voxels  step %6.2f / %6.2f s  peak %7.0f / %7.0f MiB (checkpointing off / on)" %
              (r["scene"], r["voxels"], r["off_s"], r["on_s"], r["off_mib"], r["on_mib"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=14)
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("files", nargs="+")
    a = p.parse_args()
    plot(load(a.files, a.depth), a.depth, a.out)


if __name__ == "__main__":
    main()
