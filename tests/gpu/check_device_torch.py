#!/usr/bin/env python3
"""Compiles tests/gpu/run.sh's C++ against the GPU machine's torch headers, here.

The lent GPU machines run torch 2.11.0+cu130 (/work/.library/device/KINDS.md);
this machine builds against the virtual environment's newer LibTorch. A
header that moved or an API that changed between the two would first show
as a failed build on the GPU machine, in its few minutes. This script finds
such a difference here:
  1. downloads that torch's wheel from PyPI (only the wheel, no
     dependencies) and unpacks its headers, both kept beside that build
     (build-gpu-cpu-only/device-torch/), not in .gpu/, which device calls
     carry;
  2. takes every C++ translation unit of the sparse-only build from
     `tests/gpu/run.sh --cpu-only`'s compile_commands.json
     (build-gpu-cpu-only/; --build build for the whole tree, the worker
     included), swaps the LibTorch include paths for the wheel's (the
     build's folder of links without google/, cmake/TrainsupLibTorch.cmake,
     for one made the same way), drops the precompiled header (so a file
     that compiles only because the header pulls in all of torch fails
     here too) and runs the compiler with -fsyntax-only.
kernels.cu includes no torch header and is not checked.

Usage: tests/gpu/check_device_torch.py [--torch 2.11.0] [--jobs N] [FILTER...]
  FILTER  only the files whose path contains one of these strings
Exit 0 when every file compiles; 1 naming the ones that do not.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def headers(build, version):
    """The include directory of torch==version's wheel for the device's Python 3.12."""
    cache = os.path.join(build, "device-torch", version)
    include = os.path.join(cache, "torch", "include")
    if os.path.isdir(include):
        return include
    wheels = os.path.join(build, "device-torch", "wheels")
    os.makedirs(wheels, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--platform",
                    "manylinux_2_28_x86_64", "-d", wheels, "torch==" + version], check=True)
    wheel = [w for w in os.listdir(wheels) if w.startswith("torch-" + version + "-")]
    if not wheel:
        sys.exit("check_device_torch: pip downloaded no torch-%s wheel into %s" % (version, wheels))
    with zipfile.ZipFile(os.path.join(wheels, wheel[0])) as z:
        z.extractall(cache, [n for n in z.namelist()
                             if n.startswith("torch/include/") or n == "torch/version.py"])
    return include


def without_google(include):
    """A folder of links to include's entries but google/ (the bundled
    protobuf headers), as cmake/TrainsupLibTorch.cmake makes for a build."""
    links = os.path.join(os.path.dirname(os.path.dirname(include)), "include-links")
    if not os.path.isdir(links):
        os.makedirs(links)
        for entry in os.listdir(include):
            if entry != "google":
                os.symlink(os.path.join(include, entry), os.path.join(links, entry))
    return links


def swap(path, include):
    """`path` if it is no LibTorch include folder, else the same folder of
    the wheel's headers."""
    api = "/torch/csrc/api/include"
    if path.endswith(api) and os.path.isdir(path):
        return include + api
    if os.path.isdir(os.path.join(path, "ATen")) and os.path.isdir(os.path.join(path, "c10")):
        return include if os.path.isdir(os.path.join(path, "google")) else without_google(include)
    return path


def commands(build, include, filters):
    """The build's C++ compile commands, against `include`."""
    path = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(path):
        sys.exit("check_device_torch: no %s: run `tests/gpu/run.sh --cpu-only` first" % path)
    result = []
    for entry in json.load(open(path)):
        f, cmd = entry["file"], entry["command"]
        if not f.endswith(".cc") or "/googletest/" in f:
            continue
        if filters and not any(s in f for s in filters):
            continue
        swapped = re.sub(r"(-isystem |-I)(\S+)",
                         lambda m: m.group(1) + swap(m.group(2), include), cmd)
        if swapped == cmd:
            continue  # includes no LibTorch
        cmd = swapped
        cmd = re.sub(r"-include \S*cmake_pch\.hxx", "", cmd)
        cmd = re.sub(r"-o \S+", "-o /dev/null", cmd) + " -fsyntax-only"
        result.append((f, cmd, entry["directory"]))
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch", default="2.11.0")
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    p.add_argument("--build", default=os.path.join(ROOT, "build-gpu-cpu-only"))
    p.add_argument("filters", nargs="*")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    if not os.path.isdir(args.build):
        sys.exit("check_device_torch: no %s: run `tests/gpu/run.sh --cpu-only` first" % args.build)
    include = headers(args.build, args.torch)
    version = open(os.path.join(os.path.dirname(include), "version.py")).read()
    version = re.search(r"__version__ = '([^']+)'", version).group(1)
    todo = commands(args.build, include, args.filters)
    if not todo:
        sys.exit("check_device_torch: no C++ file with LibTorch includes matched")
    print("checking %d files against torch %s headers (%s)" % (len(todo), version, include))

    def check(item):
        f, cmd, cwd = item
        r = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True)
        return f, r.returncode, r.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for f, rc, err in pool.map(check, todo):
            print(("ok    " if rc == 0 else "FAIL  ") + os.path.relpath(f, ROOT), flush=True)
            if rc:
                failed.append(f)
                print(err[:4000])
    print("%d of %d compile against torch %s" % (len(todo) - len(failed), len(todo), version))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
