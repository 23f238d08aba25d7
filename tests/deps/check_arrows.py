#!/usr/bin/env python3
"""The dependency arrows of DESIGN.md, checked on the sources.

Every #include "FOLDER/..." of one of our folders must follow an arrow:

  sparse/      -> nothing else of ours
  checkpoint/  -> nothing else of ours
  proto/       -> the checkpoint core (its atomic write)
  worker/      -> sparse, checkpoint, proto
  supervisor/  -> proto and the checkpoint core only

"trainsup/..." (the generated protobuf code) counts as proto. The
checkpoint core is the headers of trainsup_checkpoint_core's sources (the
torch-free part), passed with --core. Benchmarks count as their folder.
tests/ and fuzz/ may include anything.

Usage: check_arrows.py ROOT --core file_system,manifest,store
       check_arrows.py --self-test
Exit 0 when every include follows an arrow, 1 (listing each violation) when
not.
"""
import os
import re
import sys
import tempfile

OURS = {"sparse", "checkpoint", "proto", "worker", "supervisor", "trainsup", "tests", "fuzz"}
ALLOWED = {
    "sparse": {"sparse"},
    "checkpoint": {"checkpoint"},
    "proto": {"proto", "trainsup", "checkpoint-core"},
    "worker": {"worker", "sparse", "checkpoint", "checkpoint-core", "proto", "trainsup"},
    "supervisor": {"supervisor", "proto", "trainsup", "checkpoint-core"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_0-9]+)/([^"]+)"')
SOURCES = (".cc", ".h", ".cu", ".cuh")


def target_of(path, core):
    """The folder an include names; the checkpoint core apart."""
    folder, rest = path
    if folder == "checkpoint":
        stem = os.path.splitext(os.path.basename(rest))[0]
        if "/" not in rest and stem in core:
            return "checkpoint-core"
    return folder


def violations(root, core):
    found = []
    for folder, allowed in ALLOWED.items():
        base = os.path.join(root, folder)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                with open(full, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in OURS:
                            continue
                        target = target_of((m.group(1), m.group(2)), core)
                        if target not in allowed and not (
                            target == "checkpoint-core" and "checkpoint" in allowed
                        ):
                            rel = os.path.relpath(full, root)
                            found.append(f"{rel}:{number}: {folder}/ may not include "
                                         f"\"{m.group(1)}/{m.group(2)}\" ({target})")
    return found


def self_test():
    """The checker must be able to fail: a tree with one violation per arrow."""
    with tempfile.TemporaryDirectory() as root:
        cases = {
            "sparse/a.cc": '#include "worker/link.h"\n',
            "checkpoint/bench/b.cc": '#include "sparse/bench/bench_util.h"\n',
            "supervisor/bench/c.cc": '#include "worker/link.h"\n',
            "supervisor/d.cc": '#include "checkpoint/state.h"\n',
            "proto/e.cc": '#include "supervisor/config.h"\n',
        }
        fine = {
            "supervisor/ok.cc": '#include "checkpoint/store.h"\n#include "trainsup/v1/x.pb.h"\n',
            "worker/ok.cc": '#include "checkpoint/state.h"\n#include "sparse/ops.h"\n',
            "proto/ok.cc": '#include "checkpoint/file_system.h"\n',
        }
        for rel, text in {**cases, **fine}.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        found = violations(root, {"file_system", "manifest", "store"})
        bad = {v.split(":")[0] for v in found}
        if bad != set(cases):
            print("self-test failed: expected violations in", sorted(cases), "got", found)
            return 1
    print("self-test: all", len(cases), "violations found, none in the allowed includes")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 4 or argv[2] != "--core":
        print(__doc__)
        return 2
    core = {c for c in argv[3].split(",") if c}
    found = violations(argv[1], core)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) against the arrows of DESIGN.md")
        return 1
    print("every include follows an arrow of DESIGN.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
