#!/usr/bin/env python3
"""The dependency arrows of docs/design.md, checked on the sources.

Every #include "FOLDER/..." of one of our folders must follow an arrow:

  sparse/      -> nothing else of ours; outside sparse/, no one includes a
                  backend's headers (sparse/cpu/, sparse/generic/,
                  sparse/cuda/): the engine's public headers serve
  checkpoint/  -> nothing else of ours
  proto/       -> nothing else of ours (only .proto files)
  contracts/   -> the checkpoint core (its atomic write)
  worker/      -> sparse, checkpoint, contracts, proto; inside it, each
                  subfolder (worker/CMakeLists.txt):
    link/      -> contracts, proto (the launch and the heartbeat channel)
    data/      -> contracts (the readers)
    dataset/   -> data, sparse, contracts
    gang/      -> sparse, contracts
    split/     -> dataset, data, gang, sparse, contracts
    train/     -> split, dataset, data, gang, sparse, checkpoint, contracts, proto
    the top level (worker_main.cc) and bench/ -> any of worker/
  supervisor/  -> contracts, proto and the checkpoint core only; inside it,
                  each subfolder (docs/supervisor.md, "Where things are"):
    policy/    -> contracts only (pure decisions)
    ctl/       -> contracts only (trainctl and its output)
    store/     -> proto
    sys/       -> policy
    cluster/   -> policy, the checkpoint core, and of run/ only unit_env.h
                  (the effect interfaces it runs on)
    run/       -> policy, sys, store, the checkpoint core
    api/       -> policy, and of run/ only unit_env.h
    the top level (the daemon) and bench/ -> any of supervisor/

"trainsup/..." (the generated protobuf code) counts as proto. The
checkpoint core is the headers of trainsup_checkpoint_core's sources (the
torch-free part), passed with --core. Benchmarks count as their folder.
tests/ and fuzz/ may include anything.

And no two folders include each other: a folder that includes a header of
another may not be included by it (checked on the includes as they are,
not on the arrows above, so that a new arrow cannot bring a cycle back).

An include's target is its folder ("sparse", "supervisor/run"), or, where an
arrow allows only one file of a folder, that file ("supervisor/run/unit_env.h").

Usage: check_arrows.py ROOT --core file_system,manifest,store
       check_arrows.py --self-test
Exit 0 when every include follows an arrow, 1 (listing each violation) when
not.
"""
import os
import re
import sys
import tempfile

OURS = {"sparse", "checkpoint", "proto", "contracts", "worker", "supervisor", "trainsup", "tests",
        "fuzz"}
SUPERVISOR_SUBS = ("policy", "ctl", "store", "sys", "cluster", "run", "api")
SPARSE_BACKENDS = ("cpu", "generic", "cuda")
WORKER_SUBS = ("link", "data", "dataset", "gang", "split", "train")
CONTRACTS = {"contracts", "proto", "trainsup"}
ALLOWED = {
    "sparse": {"sparse"} | {f"sparse/{b}" for b in SPARSE_BACKENDS},
    "checkpoint": {"checkpoint"},
    "proto": {"proto", "trainsup"},
    "contracts": {"contracts", "checkpoint-core"},
    "worker": {"worker", "sparse", "checkpoint", "checkpoint-core"} | CONTRACTS
    | {f"worker/{s}" for s in WORKER_SUBS},
    "worker/link": {"worker/link"} | CONTRACTS,
    "worker/data": {"worker/data"} | CONTRACTS,
    "worker/dataset": {"worker/dataset", "worker/data", "sparse"} | CONTRACTS,
    "worker/gang": {"worker/gang", "sparse"} | CONTRACTS,
    "worker/split": {"worker/split", "worker/dataset", "worker/data", "worker/gang", "sparse"}
    | CONTRACTS,
    "worker/train": {"worker/train", "worker/split", "worker/dataset", "worker/data",
                     "worker/gang", "sparse", "checkpoint", "checkpoint-core"} | CONTRACTS,
    "supervisor": {"supervisor", "checkpoint-core"} | CONTRACTS
    | {f"supervisor/{s}" for s in SUPERVISOR_SUBS},
    "supervisor/policy": {"supervisor/policy"} | CONTRACTS,
    "supervisor/ctl": {"supervisor/ctl"} | CONTRACTS,
    "supervisor/store": {"supervisor/store", "proto", "trainsup"},
    "supervisor/sys": {"supervisor/sys", "supervisor/policy"} | CONTRACTS,
    "supervisor/cluster": {"supervisor/cluster", "supervisor/policy", "checkpoint-core",
                           "supervisor/run/unit_env.h"} | CONTRACTS,
    "supervisor/run": {"supervisor/run", "supervisor/policy", "supervisor/sys",
                       "supervisor/store", "checkpoint-core",
                       "supervisor/policy/cluster_protocol.h"} | CONTRACTS,
    "supervisor/api": {"supervisor/api", "supervisor/policy", "supervisor/run/unit_env.h"}
    | CONTRACTS,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_0-9]+)/([^"]+)"')
SOURCES = (".cc", ".h", ".cu", ".cuh")


def folder_of(rel_dir):
    """The ALLOWED entry a source directory belongs to (its longest prefix)."""
    parts = rel_dir.split(os.sep)
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in ALLOWED:
            return key
    return None


def targets_of(folder, rest, core):
    """What an include names: its folder, and the file where an arrow names one."""
    if folder == "checkpoint":
        stem = os.path.splitext(os.path.basename(rest))[0]
        if "/" not in rest and stem in core:
            return ["checkpoint-core"]
        return ["checkpoint"]
    if folder == "sparse" and rest.split("/")[0] in SPARSE_BACKENDS and "/" in rest:
        return [f"sparse/{rest.split('/')[0]}"]
    if folder == "supervisor":
        sub = rest.split("/")[0]
        if "/" in rest and sub in SUPERVISOR_SUBS:
            return [f"supervisor/{rest}", f"supervisor/{sub}"]
        return ["supervisor"]
    if folder == "worker":
        sub = rest.split("/")[0]
        if "/" in rest and sub in WORKER_SUBS:
            return [f"worker/{sub}"]
        return ["worker"]
    return [folder]


def folder_cycles(edges):
    """Pairs of folders that include each other, from (from, to, where)
    edges; one line per pair, naming an include each way."""
    first = {}
    for a, b, where in edges:
        if a != b:
            first.setdefault((a, b), where)
    found = []
    for (a, b), where in sorted(first.items()):
        if a < b and (b, a) in first:
            found.append(f"{where}: {a}/ and {b}/ include each other "
                         f"(and {first[(b, a)]})")
    return found


def violations(root, core):
    found = []
    edges = []
    for top in sorted({k.split("/")[0] for k in ALLOWED}):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            folder = folder_of(os.path.relpath(dirpath, root))
            allowed = ALLOWED[folder]
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                with open(full, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in OURS:
                            continue
                        targets = targets_of(m.group(1), m.group(2), core)
                        rel = os.path.relpath(full, root)
                        edges.append((folder, targets[-1].replace("checkpoint-core", "checkpoint"),
                                      f"{rel}:{number}"))
                        ok = any(t in allowed for t in targets) or (
                            targets == ["checkpoint-core"] and "checkpoint" in allowed)
                        if not ok:
                            rel = os.path.relpath(full, root)
                            found.append(f"{rel}:{number}: {folder}/ may not include "
                                         f"\"{m.group(1)}/{m.group(2)}\" ({targets[-1]})")
    return found + folder_cycles(edges)


def self_test():
    """The checker must be able to fail: a tree with one violation per arrow."""
    with tempfile.TemporaryDirectory() as root:
        cases = {
            "sparse/a.cc": '#include "worker/link/link.h"\n',
            "checkpoint/bench/b.cc": '#include "sparse/bench/bench_util.h"\n',
            "supervisor/bench/c.cc": '#include "worker/link/link.h"\n',
            "supervisor/d.cc": '#include "checkpoint/state.h"\n',
            "contracts/e.cc": '#include "supervisor/policy/auth.h"\n',
            "supervisor/policy/f.h": '#include "supervisor/sys/process.h"\n',
            "supervisor/ctl/g.cc": '#include "supervisor/api/outbox.h"\n',
            "supervisor/store/h.cc": '#include "supervisor/policy/auth.h"\n',
            "supervisor/sys/i.cc": '#include "supervisor/run/run_unit.h"\n',
            "supervisor/cluster/j.cc": '#include "supervisor/run/run_unit.h"\n',
            "supervisor/run/k.cc": '#include "supervisor/cluster/etcd_client.h"\n',
            "supervisor/api/l.cc": '#include "supervisor/store/state_store.h"\n',
            "supervisor/policy/m.cc": '#include "supervisor/daemon.h"\n',
            "worker/n.cc": '#include "supervisor/policy/auth.h"\n',
            "worker/bench/o.cc": '#include "sparse/cpu/blas.h"\n',
            "worker/data/p.cc": '#include "worker/dataset/dataset.h"\n',
            "worker/split/q.cc": '#include "worker/train/trainer.h"\n',
            "worker/link/r.cc": '#include "sparse/ops.h"\n',
            "supervisor/run/s.cc": '#include "supervisor/cluster/cluster.h"\n',
        }
        fine = {
            "supervisor/ok.cc": '#include "checkpoint/store.h"\n#include "trainsup/v1/x.pb.h"\n'
                                '#include "supervisor/run/run_unit.h"\n',
            "worker/ok.cc": '#include "checkpoint/state.h"\n#include "sparse/ops.h"\n'
                            '#include "contracts/spec.h"\n',
            "contracts/ok.cc": '#include "checkpoint/file_system.h"\n',
            "sparse/ok.cc": '#include "sparse/cpu/blas.h"\n#include "sparse/runtime.h"\n',
            "supervisor/policy/ok.cc": '#include "contracts/spec.h"\n'
                                       '#include "supervisor/policy/auth.h"\n',
            "supervisor/cluster/ok.cc": '#include "supervisor/run/unit_env.h"\n',
            "supervisor/run/ok.cc": '#include "supervisor/policy/cluster_protocol.h"\n'
                                    '#include "supervisor/sys/process.h"\n',
            "supervisor/api/ok.cc": '#include "supervisor/run/unit_env.h"\n',
        }
        for rel, text in {**cases, **fine}.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        found = violations(root, {"file_system", "manifest", "store"})
        bad = {v.split(":")[0] for v in found if "include each other" not in v}
        if bad != set(cases):
            print("self-test failed: expected violations in", sorted(cases), "got", found)
            return 1
    cycle = folder_cycles([("a", "b", "a/x.cc:3"), ("b", "c", "b/y.cc:1"), ("b", "a", "b/z.h:7"),
                           ("a", "a", "a/w.cc:1")])
    if len(cycle) != 1 or "a/ and b/ include each other" not in cycle[0]:
        print("self-test failed: expected one cycle between a/ and b/, got", cycle)
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
        print(f"{len(found)} include(s) against the arrows of docs/design.md")
        return 1
    print("every include follows an arrow of docs/design.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
