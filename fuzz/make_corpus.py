#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/NAME/), from the
reader test files in tests/data, deploy/trainsupd.toml and hand-made inputs
in each target's input layout (see the *_fuzzer.cc files). Deterministic;
run it from anywhere and commit what changes."""
import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
DATA = ROOT / "tests" / "data"
E = "\u00e9"  # in toml++ 3.3.0's undefined range (contracts/toml_guard.h)


def put(target, name, content):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(content if isinstance(content, bytes) else content.encode())


def copy_files(target, pattern, names=None):
    for path in sorted(DATA.glob(pattern)):
        if names is None or path.stem in names:
            put(target, path.parent.parent.name + "_" + path.name, path.read_bytes())


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    copy_files("ply", "valid/ply/*.ply")
    copy_files("ply", "malformed/ply/*.ply", {"list_past_end", "count_exceeds_file", "ascii_truncated"})
    copy_files("las", "valid/las/*.las")
    copy_files("las", "malformed/las/*.las", {"counts_disagree_v14", "record_too_short", "truncated"})

    kitti = DATA / "valid" / "semantickitti" / "sequences" / "00"
    scan = (kitti / "velodyne" / "000000.bin").read_bytes()
    labels = (kitti / "labels" / "000000.label").read_bytes()
    put("semantic_kitti", "labelled", bytes([len(labels) // 4]) + scan + labels)
    put("semantic_kitti", "unlabelled", b"\0" + (DATA / "valid/semantickitti/unlabelled.bin").read_bytes())
    put("semantic_kitti", "short_labels", bytes([2]) + scan + labels[:8])

    s3dis = DATA / "valid" / "s3dis"
    put("s3dis", "room_labelled", b"\0" + (s3dis / "room_labelled.txt").read_bytes())
    put("s3dis", "room_unlabelled", b"\0" + (s3dis / "room_unlabelled.txt").read_bytes())
    annotations = s3dis / "Area_1" / "office_1" / "Annotations"
    parts = [f.name.encode() + b"\n" + f.read_bytes() for f in sorted(annotations.glob("*.txt"))]
    put("s3dis", "annotations", b"\1" + b"\0".join(parts))
    put("s3dis", "unknown_class", b"\1" + b"spaceship_1.txt\n1 2 3 4 5 6\n")

    files = [{"name": "model.safetensors", "size": 52428912, "xxh3_128": "0123456789abcdef" * 2}]
    manifest = {"format": "trainsup-checkpoint", "format_version": 1, "step": 1200,
                "created": "2026-11-29T11:52:10Z", "files": files}
    put("manifest", "valid", json.dumps(manifest, indent=2))
    put("manifest", "version_2_pow_32_plus_1", json.dumps(dict(manifest, format_version=4294967297)))
    put("manifest", "step_2_pow_64_minus_1", json.dumps(dict(manifest, step=18446744073709551615)))
    put("manifest", "no_files", json.dumps(dict(manifest, files=[])))

    f32 = struct.pack("<4f", 1.0, -2.5, 3.25, 0.0)
    put("safetensors", "two_tensors", safetensors(
        {"weight": ("F32", [2, 2], f32), "step": ("I64", [], struct.pack("<q", 7))}, {"format": "pt"}))
    put("safetensors", "empty_tensor", safetensors({"bias": ("BF16", [0], b"")}))
    put("safetensors", "bool_u8", safetensors({"mask": ("BOOL", [3], b"\1\0\1"), "b": ("U8", [1], b"\7")}))

    put("exit_file", "stopped", json.dumps({"code": 143, "reason": "stopped", "message": "stopped on request after checkpoint step-12", "last_step": 12, "time_ms": 1700000000000}, indent=2))
    put("exit_file", "code_only", '{"code": 0}')
    put("exit_file", "code_2_pow_32_plus_143", '{"code": 4294967439, "reason": "stopped"}')
    put("exit_file", "unicode_message", json.dumps({"code": 65, "reason": "data", "message": "caf" + E + " \u2603"}))

    put("spec", "synthetic", 'name = "demo"\nworld_size = 1\n[train]\nsteps = 100\ncheckpoint_every_steps = 10\n[testing]\nstep_ms = 5\n')
    put("spec", "full", '''name = "kitti-unet"
priority = 10
[model]
arch = "minkunet34"
in_channels = 1
voxel_size = 0.05
gradient_checkpointing = true
[data]
format = "semantickitti"
path = "/srv/data/kitti/sequences"
ignore_label = 0
val_fraction = 0.1
[optimizer]
kind = "adamw"
lr = 0.001
schedule = "cosine"
warmup_steps = 200
[train]
batch_size = 4
epochs = 2
checkpoint_every_seconds = 600
''')
    put("spec", "bare_e_acute", E)
    put("spec", "non_ascii_in_strings", f'# caf{E}\nname = "r"\n[data]\nlabel_property = \'caf{E}\'\n')

    put("config", "deploy", (ROOT / "deploy" / "trainsupd.toml").read_bytes())
    put("config", "tcp_and_tokens", '''[daemon]
state_dir = "state"
tcp_address = "0.0.0.0:50051"
tls_cert = "tls/server.pem"
tls_key = "tls/server.key"
data_roots = ["data", "/mnt/scans/../datasets"]
[slots]
cpu_slots = 4
[restart]
jitter = 0
[auth]
generate_default_tokens = false
[[auth.tokens]]
name = "ci"
role = "operator"
token_file = "tokens/ci.token"
''')
    put("config", "root_state_dir", '[daemon]\nstate_dir = "/"\n')
    put("config", "bare_e_acute", E)

    put("toml", "bare_e_acute", E)
    put("toml", "after_value", f"a = 1 {E}\n")
    put("toml", "quote_after_number", f"a = 1'{E}'\n")
    put("toml", "continued_line", f'a = """x\\\n{E}"""\n')
    put("toml", "after_backslash", f'a = """\\{E}"""\n')
    put("toml", "five_quotes", f'a = """x"""""{E}\n')
    put("toml", "everything", f'''# {E}
[server."{E}"]
a = "caf{E}"
b = 'caf{E}'
c = """
caf{E}\\
   x"""
d = [1, 2.5, true, 1979-05-27T07:32:00Z, {{ e = "{E}" }}]
[[f]]
g = 0x1F
''')

    # cluster_records: the first byte picks the record (0 join, 1
    # generation, 2 key), the rest is the value as etcd holds it.
    join = {"node": "node-a", "run_id": "r-1", "attempt": 2, "address": "10.0.0.1", "port": 29500,
            "steps": [30, 20, 10]}
    put("cluster_records", "join", b"\x00" + json.dumps(join).encode())
    put("cluster_records", "join_huge_port", b"\x00" + json.dumps(dict(join, port=1e30)).encode())
    generation = {"generation": 3, "action": "run", "restarts": 2, "delay_s": 2.0, "by": "node-b",
                  "reason": "node node-b: rank 1 ended: killed by signal 9 (SIGKILL)",
                  "history": [{"end_s": 1700000000.5, "class": "crash", "made_progress": True,
                               "detail": "caf" + E}]}
    put("cluster_records", "generation", b"\x01" + json.dumps(generation).encode())
    put("cluster_records", "generation_fail", b"\x01" + json.dumps(
        {"generation": 9, "action": "fail", "reason": "only 1 of 2 nodes joined"}).encode())
    put("cluster_records", "generation_float", b"\x01" + b'{"generation": 1e300}')
    put("cluster_records", "key_join", b"\x02rdzv/4/node-a")
    put("cluster_records", "key_not_utf8", b"\x02rdzv/1/\xff\xfe")
    put("cluster_records", "key_node", b"\x02nodes/node-b")


if __name__ == "__main__":
    main()
