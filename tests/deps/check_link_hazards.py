#!/usr/bin/env python3
"""The link hazards of building on the torch wheel (docs/building.md, "Link
hazards"), checked on the built binaries and the compile database:

  - the daemon and the CLI link no LibTorch and no CUDA library;
  - no binary needs libcuda.so (the driver; a machine without a GPU has
    none), libgloo (Gloo's code is the wheel's) or the toolkit's stubs, and
    no RPATH/RUNPATH names the stubs or /usr/local/cuda (the CUDA libraries
    loaded are the wheel's);
  - the worker's RUNPATH reaches the wheel's CUDA libraries;
  - no translation unit of our generated .pb.cc sees torch's include
    directories (the wheel carries protobuf headers of its own).

Usage: check_link_hazards.py BUILD_DIR TORCH_ROOT
       check_link_hazards.py --self-test   (the checks can fail)"""

import json
import os
import re
import subprocess
import sys


def dynamic_section(path):
    """(NEEDED sonames, RPATH/RUNPATH entries) of an ELF file, from readelf."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                         check=True).stdout
    return parse_dynamic(out)


def parse_dynamic(text):
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)
    paths = []
    for m in re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]", text):
        paths.extend(p for p in m.split(":") if p)
    return needed, paths


def check_binary(name, needed, paths, torch_free, needs_cuda_dir, torch_root):
    problems = []
    for lib in needed:
        if lib.startswith("libcuda.so"):
            problems.append(f"{name} needs {lib} (the driver: absent without a GPU)")
        if lib.startswith("libgloo"):
            problems.append(f"{name} needs {lib} (Gloo's code must be the wheel's)")
        if torch_free and re.match(r"lib(torch|c10|cudart|cublas|cudnn|nccl)", lib):
            problems.append(f"{name} links {lib}, but must stay torch-free (docs/design.md)")
    for p in paths:
        if "stubs" in p:
            problems.append(f"{name}: RPATH entry {p} names the toolkit's stubs")
        if p.startswith("/usr/local/cuda"):
            problems.append(f"{name}: RPATH entry {p} would load the toolkit's CUDA "
                            "libraries instead of the wheel's")
    if needs_cuda_dir:
        real_root = os.path.realpath(os.path.join(torch_root, ".."))
        if not any(os.path.realpath(p).startswith(real_root) and "nvidia" in p for p in paths) \
                and not any(os.path.realpath(p) == os.path.realpath(
                    os.path.join(torch_root, "lib")) for p in paths):
            problems.append(f"{name}: no RPATH entry reaches the wheel's CUDA libraries "
                            f"(under {real_root}/nvidia): {paths}")
    return problems


def check_compile_commands(entries, torch_root):
    problems = []
    inc = os.path.join(torch_root, "include")
    seen = 0
    for e in entries:
        if not e["file"].endswith(".pb.cc"):
            continue
        seen += 1
        cmd = e.get("command") or " ".join(e.get("arguments", []))
        if inc in cmd:
            problems.append(f"{e['file']} is compiled with {inc} (torch's protobuf headers)")
    if seen == 0:
        problems.append("no .pb.cc in compile_commands.json: nothing was checked")
    return problems


def main(build, torch_root):
    problems = []
    bins = {
        "trainsupd": (True, False),
        "trainctl": (True, False),
        "trainsup-worker": (False, True),
    }
    for name, (torch_free, needs_cuda_dir) in bins.items():
        path = None
        for cand in (os.path.join(build, "bin", name), os.path.join(build, "supervisor", name)):
            if os.path.exists(cand):
                path = cand
        if path is None:
            problems.append(f"{name}: not built under {build}")
            continue
        needed, paths = dynamic_section(path)
        problems += check_binary(name, needed, paths, torch_free, needs_cuda_dir, torch_root)
        print(f"{name}: NEEDED {' '.join(needed)}")
    with open(os.path.join(build, "compile_commands.json")) as f:
        problems += check_compile_commands(json.load(f), torch_root)
    for p in problems:
        print("FAIL:", p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


def self_test():
    root = "/opt/v/lib/python3.11/site-packages/torch"
    bad = """
 0x0000000000000001 (NEEDED)             Shared library: [libtorch_cpu.so]
 0x0000000000000001 (NEEDED)             Shared library: [libcuda.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libgloo.so.0]
 0x000000000000001d (RUNPATH)            Library runpath: [/usr/local/cuda/lib64/stubs:/x]
"""
    needed, paths = parse_dynamic(bad)
    assert needed == ["libtorch_cpu.so", "libcuda.so.1", "libgloo.so.0"], needed
    assert paths == ["/usr/local/cuda/lib64/stubs", "/x"], paths
    found = check_binary("trainsupd", needed, paths, True, True, root)
    for what in ("libcuda.so.1", "libgloo", "torch-free", "stubs", "toolkit's CUDA",
                 "reaches the wheel"):
        assert any(what in p for p in found), (what, found)
    good_needed = ["libtorch_cpu.so", "libcudart.so.13"]
    good_paths = [root + "/lib", root + "/../nvidia/cu13/lib"]
    assert check_binary("trainsup-worker", good_needed, good_paths, False, True, root) == []
    entries = [{"file": "/b/proto/gen/a.pb.cc", "command": f"c++ -isystem {root}/include -c a"}]
    assert check_compile_commands(entries, root), "torch include on a .pb.cc must fail"
    assert check_compile_commands([], root), "an empty database must fail"
    entries = [{"file": "/b/proto/gen/a.pb.cc", "command": "c++ -I/usr/include -c a"}]
    assert check_compile_commands(entries, root) == []
    print("self-test: every check fails on a violating input")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    sys.exit(main(sys.argv[1], sys.argv[2]))
