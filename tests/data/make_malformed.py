#!/usr/bin/env python3
"""Makes the point-cloud reader corpus under tests/data (committed).

    tests/data/valid/<format>/...      tiny files the readers must read exactly
    tests/data/malformed/<format>/...  damaged files, each with the error the
                                       reader must give (tests/worker/data/readers_test.cc)

Run without arguments to (re)write the files; with --check to verify that the
committed files are exactly what this script makes (a ctest does this).
Deterministic, standard library only.
"""

import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# The points every valid file holds (in its own encoding): x y z, rgb 0-255,
# label (-1: unlabelled).
POINTS = [
    (0.0, 0.0, 0.0, (255, 0, 0), 0),
    (1.0, 0.5, -2.0, (0, 255, 0), 1),
    (2.25, 3.0, 4.0, (0, 0, 255), 2),
    (-1.0, -1.0, 1.0, (51, 102, 204), -1),
]

files = {}  # relative path -> bytes


def put(path, data):
    if isinstance(data, str):
        data = data.encode()
    assert path not in files, path
    files[path] = data


# ----------------------------------------------------------------------------
# PLY

PLY_FMT = {"char": "b", "uchar": "B", "short": "h", "ushort": "H", "int": "i",
           "uint": "I", "float": "f", "double": "d"}


def ply_header(encoding, elements, comments=("made by tests/data/make_malformed.py",)):
    """elements: [(name, count, [(type, name) | ("list", ctype, itype, name)])]"""
    lines = ["ply", "format %s 1.0" % encoding]
    lines += ["comment " + c for c in comments]
    for name, count, props in elements:
        lines.append("element %s %d" % (name, count))
        for p in props:
            if p[0] == "list":
                lines.append("property list %s %s %s" % (p[1], p[2], p[3]))
            else:
                lines.append("property %s %s" % (p[0], p[1]))
    lines.append("end_header")
    return ("\n".join(lines) + "\n").encode()


def ply_binary_record(props, values, big_endian):
    """values: one entry per property; a list property takes a list."""
    order = ">" if big_endian else "<"
    out = b""
    for p, v in zip(props, values):
        if p[0] == "list":
            out += struct.pack(order + PLY_FMT[p[1]], len(v))
            out += b"".join(struct.pack(order + PLY_FMT[p[2]], x) for x in v)
        else:
            out += struct.pack(order + PLY_FMT[p[0]], v)
    return out


def ply_binary(elements, rows, big_endian=False):
    """rows: {element name: [values per record]}"""
    body = b""
    for name, _, props in elements:
        for values in rows.get(name, []):
            body += ply_binary_record(props, values, big_endian)
    enc = "binary_big_endian" if big_endian else "binary_little_endian"
    return ply_header(enc, elements) + body


def ascii_value(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(v)


def ply_ascii(elements, rows):
    body = ""
    for name, _, props in elements:
        for values in rows.get(name, []):
            tokens = []
            for p, v in zip(props, values):
                if p[0] == "list":
                    tokens.append(str(len(v)))
                    tokens += [ascii_value(x) for x in v]
                else:
                    tokens.append(ascii_value(v))
            body += " ".join(tokens) + "\n"
    return ply_header("ascii", elements) + body.encode()


VERTEX_PROPS = [("float", "x"), ("float", "y"), ("float", "z"),
                ("uchar", "red"), ("uchar", "green"), ("uchar", "blue"),
                ("float", "nx"), ("int", "label")]


def vertex_rows(points=POINTS):
    return [[x, y, z, c[0], c[1], c[2], 0.5, l] for x, y, z, c, l in points]


def make_ply():
    v = "valid/ply/"
    # Little-endian, packed records: an element to skip before the vertices
    # (fixed size) and a face list after them.
    elements = [("camera", 1, [("float", "fx"), ("uchar", "id")]),
                ("vertex", 4, VERTEX_PROPS),
                ("face", 1, [("list", "uchar", "int", "vertex_indices")])]
    put(v + "points_le.ply", ply_binary(elements, {
        "camera": [[500.0, 7]], "vertex": vertex_rows(), "face": [[[0, 1, 2]]]}))
    # Big-endian double coordinates, with list properties both before the
    # vertices and inside them (variable-length records), the label as a
    # short property named "class".
    be_props = [("double", "x"), ("double", "y"), ("double", "z"),
                ("list", "uchar", "float", "extra"),
                ("uchar", "red"), ("uchar", "green"), ("uchar", "blue"),
                ("short", "class")]
    be_elements = [("face", 2, [("list", "uint", "int", "vertex_indices")]),
                   ("vertex", 4, be_props)]
    be_rows = [[x, y, z, [1.0] * i, c[0], c[1], c[2], l]
               for i, (x, y, z, c, l) in enumerate(POINTS)]
    put(v + "points_be.ply", ply_binary(be_elements, {
        "face": [[[0, 1, 2]], [[1, 2, 3, 0]]], "vertex": be_rows}, big_endian=True))
    # Ascii, CRLF line ends, a list element before the vertices, the label as
    # a float property named scalar_Classification.
    a_props = [("float", "x"), ("float", "y"), ("float", "z"),
               ("uchar", "red"), ("uchar", "green"), ("uchar", "blue"),
               ("float", "scalar_Classification")]
    a_elements = [("edge", 1, [("list", "uchar", "int", "ends"), ("uchar", "w")]),
                  ("vertex", 4, a_props)]
    a_rows = [[x, y, z, c[0], c[1], c[2], float(l)] for x, y, z, c, l in POINTS]
    put(v + "points_ascii.ply",
        ply_ascii(a_elements, {"edge": [[[0, 1], 3]], "vertex": a_rows}).replace(b"\n", b"\r\n"))
    # Georeferenced double coordinates (recentred), ushort colours, the label
    # in a property chosen by name while a "label" property also exists.
    g_props = [("double", "x"), ("double", "y"), ("double", "z"),
               ("ushort", "red"), ("ushort", "green"), ("ushort", "blue"),
               ("int", "label"), ("uchar", "semantic")]
    g_rows = [[596700.25 + x, 4176972.5 + y, 73.0 + z, c[0] * 257, c[1] * 257, c[2] * 257, 9,
               max(l, 0) + 10] for x, y, z, c, l in POINTS]
    put(v + "georeferenced.ply", ply_binary([("vertex", 4, g_props)], {"vertex": g_rows}))
    # No labels in the file; a side file has them.
    n_props = [("float", "x"), ("float", "y"), ("float", "z")]
    put(v + "side_labels.ply", ply_binary([("vertex", 4, n_props)],
                                          {"vertex": [[p[0], p[1], p[2]] for p in POINTS]}))
    put(v + "side_labels.labels", "".join("%d\n" % p[4] for p in POINTS))

    m = "malformed/ply/"
    good = ply_binary([("vertex", 4, VERTEX_PROPS)], {"vertex": vertex_rows()})
    put(m + "truncated.ply", good[:-13])
    put(m + "ascii_truncated.ply",
        ply_ascii([("vertex", 4, VERTEX_PROPS)], {"vertex": vertex_rows()})[:-30])
    put(m + "bad_magic.ply", b"plx\n" + good[4:])
    put(m + "unknown_format.ply", good.replace(b"binary_little_endian", b"binary_middle_endian"))
    put(m + "no_end_header.ply", good[:good.index(b"end_header\n")])
    put(m + "unexpected_keyword.ply", good.replace(b"end_header\n", b"end_headr\n"))
    nan_rows = vertex_rows()
    nan_rows[1][1] = float("nan")
    put(m + "nan_coordinate.ply", ply_binary([("vertex", 4, VERTEX_PROPS)], {"vertex": nan_rows}))
    inf_rows = vertex_rows()
    inf_rows[2][2] = float("inf")
    put(m + "inf_coordinate.ply", ply_ascii([("vertex", 4, VERTEX_PROPS)], {"vertex": inf_rows}))
    put(m + "label_count_mismatch.ply", good)
    put(m + "label_count_mismatch.labels", "0\n1\n2\n")
    put(m + "count_exceeds_file.ply",
        good.replace(b"element vertex 4\n", b"element vertex 1000000000\n"))
    put(m + "unknown_type.ply", good.replace(b"property float y", b"property float16 y"))
    put(m + "missing_x.ply", good.replace(b"property float x", b"property float u"))
    put(m + "missing_label_property.ply", good)
    frac_rows = [[x, y, z, c[0], c[1], c[2], 2.5 if l == 2 else float(l)]
                 for x, y, z, c, l in POINTS]
    put(m + "fractional_label.ply", ply_binary([("vertex", 4, a_props[:6] + [("float", "label")])],
                                               {"vertex": frac_rows}))
    neg_rows = vertex_rows()
    neg_rows[3][7] = -7
    put(m + "negative_label.ply", ply_binary([("vertex", 4, VERTEX_PROPS)], {"vertex": neg_rows}))
    bad_num = ply_ascii([("vertex", 4, VERTEX_PROPS)], {"vertex": vertex_rows()})
    put(m + "not_a_number.ply", bad_num.replace(b"\n2.25 ", b"\n2.2.5 "))
    range_rows = vertex_rows()
    range_rows[0][3] = 300
    put(m + "value_out_of_range.ply",
        ply_ascii([("vertex", 4, VERTEX_PROPS)], {"vertex": range_rows}))
    # A list whose length runs past the end of the file.
    l_props = [("float", "x"), ("float", "y"), ("float", "z"), ("list", "uchar", "float", "extra")]
    l_body = ply_binary([("vertex", 2, l_props)],
                        {"vertex": [[0.0, 0.0, 0.0, [1.0]], [1.0, 1.0, 1.0, [2.0]]]})
    put(m + "list_past_end.ply", l_body[:-5] + struct.pack("<B", 200) + l_body[-4:])
    put(m + "no_vertex_element.ply",
        ply_binary([("face", 1, [("list", "uchar", "int", "vertex_indices")])],
                   {"face": [[[0, 1, 2]]]}))


# ----------------------------------------------------------------------------
# LAS

RECORD_SIZE = {0: 20, 1: 28, 2: 26, 3: 34}


def las(points, fmt=3, version=(1, 2), scale=(0.01, 0.01, 0.01), offset=(1000.0, 2000.0, 50.0),
        record_length=None, header_size=None, legacy_count=None, count64=None, vlr=b"",
        offset_to_points=None, magic=b"LASF", format_byte=None):
    """points: [(X, Y, Z, classification byte, (r, g, b) uint16)] as stored."""
    minor = version[1]
    if header_size is None:
        header_size = 375 if minor >= 4 else (235 if minor == 3 else 227)
    if record_length is None:
        record_length = RECORD_SIZE.get(fmt, 30)
    if offset_to_points is None:
        offset_to_points = header_size + len(vlr)
    if legacy_count is None:
        legacy_count = len(points) if minor < 4 or fmt <= 5 else 0
    h = bytearray(max(header_size, 375 if minor >= 4 else 227))
    struct.pack_into("<4sHH16sBB32s32sHHHII", h, 0, magic, 0, 0, b"\0" * 16, version[0], minor,
                     b"trainsup tests", b"make_malformed.py", 1, 2024, header_size,
                     offset_to_points, 1 if vlr else 0)
    struct.pack_into("<BHI5I", h, 104, fmt if format_byte is None else format_byte,
                     record_length, legacy_count, legacy_count, 0, 0, 0, 0)
    struct.pack_into("<3d3d", h, 131, *scale, *offset)
    xs = [p[0] * scale[0] + offset[0] for p in points] or [0]
    ys = [p[1] * scale[1] + offset[1] for p in points] or [0]
    zs = [p[2] * scale[2] + offset[2] for p in points] or [0]
    if all(math.isfinite(v) for v in xs + ys + zs):
        struct.pack_into("<6d", h, 179, max(xs), min(xs), max(ys), min(ys), max(zs), min(zs))
    if minor >= 4:
        struct.pack_into("<QQIQ", h, 227, 0, 0, 0, len(points) if count64 is None else count64)
    body = b""
    for i, (X, Y, Z, cls, rgb) in enumerate(points):
        rec = struct.pack("<iiiHBBbBH", X, Y, Z, 100 + i, 0x11, cls, 0, 0, 7)
        if fmt in (1, 3):
            rec += struct.pack("<d", 1000.5 + i)
        if fmt in (2, 3):
            rec += struct.pack("<HHH", *rgb)
        rec += b"\xee" * (record_length - len(rec))
        body += rec[:record_length]
    return bytes(h[:header_size]) + vlr + body


# Stored integers; with scale 0.01 and offset (1000, 2000, 50) they are
# (1000, 2000, 50), (1001.5, 2000.25, 48), (999, 1999.99, 50.01).
LAS_POINTS = [
    (0, 0, 0, 2, (65535, 0, 0)),
    (150, 25, -200, 0x80 | 6, (0, 65535, 0)),      # withheld flag: class 6
    (-100, -1, 1, 0x20 | 5, (0, 0, 32768)),        # synthetic flag: class 5
]


def vlr_record():
    # A VLR header (54 bytes) and 10 bytes of payload the reader skips.
    return struct.pack("<H16sHH32s", 0, b"trainsup", 1, 10, b"test record") + b"0123456789"


def make_las():
    v = "valid/las/"
    put(v + "format3_v12.las", las(LAS_POINTS, fmt=3, version=(1, 2)))
    put(v + "format2_v13.las", las(LAS_POINTS, fmt=2, version=(1, 3)))
    put(v + "format1_v10.las", las(LAS_POINTS, fmt=1, version=(1, 0)))
    # 1.4 header, legacy count 0, 64-bit count, 4 extra bytes per record, a
    # VLR between header and points.
    put(v + "format0_v14_extra_bytes.las",
        las(LAS_POINTS, fmt=0, version=(1, 4), record_length=24, legacy_count=0,
            vlr=vlr_record()))
    put(v + "side_labels.las", las(LAS_POINTS, fmt=0))
    put(v + "side_labels.labels", "7\n8\n9\n")

    m = "malformed/las/"
    good = las(LAS_POINTS)
    put(m + "truncated.las", good[:-10])
    put(m + "bad_magic.las", b"LASX" + good[4:])
    put(m + "short_header.las", good[:100])
    put(m + "nan_scale.las", las(LAS_POINTS, scale=(float("nan"), 0.01, 0.01)))
    put(m + "inf_offset.las", las(LAS_POINTS, offset=(1000.0, 2000.0, float("inf"))))
    put(m + "inf_coordinate.las", las(LAS_POINTS, scale=(1e308, 0.01, 0.01)))
    put(m + "label_count_mismatch.las", good)
    put(m + "label_count_mismatch.labels", "1\n2\n")
    put(m + "count_exceeds_file.las", las(LAS_POINTS, legacy_count=4000000000))
    put(m + "point_format_6.las", las(LAS_POINTS[:1], fmt=6, version=(1, 4)))
    put(m + "compressed.laz", las(LAS_POINTS, format_byte=0x83))
    put(m + "version_2_0.las", las(LAS_POINTS, version=(2, 0)))
    put(m + "record_too_short.las", las(LAS_POINTS, fmt=3, record_length=20))
    put(m + "offset_inside_header.las", las(LAS_POINTS, offset_to_points=100))
    put(m + "counts_disagree_v14.las", las(LAS_POINTS, fmt=0, version=(1, 4), legacy_count=5))
    put(m + "v14_short_header.las", las(LAS_POINTS, fmt=0, version=(1, 4), header_size=227))


# ----------------------------------------------------------------------------
# SemanticKITTI

def kitti_bin(points):
    return b"".join(struct.pack("<4f", *p) for p in points)


def kitti_label(labels):
    return b"".join(struct.pack("<I", l) for l in labels)


KITTI_POINTS = [(1.5, -2.0, 0.25, 0.5), (10.0, 0.0, -1.75, 0.0), (-3.0, 4.0, 2.0, 1.0)]


def make_kitti():
    v = "valid/semantickitti/"
    put(v + "sequences/00/velodyne/000000.bin", kitti_bin(KITTI_POINTS))
    # semantic class in the low 16 bits, instance id above.
    put(v + "sequences/00/labels/000000.label",
        kitti_label([40, (7 << 16) | 10, (65535 << 16) | 252]))
    put(v + "unlabelled.bin", kitti_bin(KITTI_POINTS))

    m = "malformed/semantickitti/"
    good = kitti_bin(KITTI_POINTS)
    put(m + "truncated.bin", good[:-8])
    put(m + "nan_coordinate.bin",
        kitti_bin([KITTI_POINTS[0], (float("nan"), 0.0, 0.0, 0.0), KITTI_POINTS[2]]))
    put(m + "inf_coordinate.bin",
        kitti_bin([KITTI_POINTS[0], KITTI_POINTS[1], (0.0, 0.0, float("-inf"), 0.0)]))
    put(m + "nan_remission.bin", kitti_bin([KITTI_POINTS[0], (0.0, 0.0, 0.0, float("nan"))]))
    put(m + "label_count_mismatch.bin", good)
    put(m + "label_count_mismatch.label", kitti_label([40, 40]))
    put(m + "truncated_label.bin", good)
    put(m + "truncated_label.label", kitti_label([40, 40, 40])[:-2])
    put(m + "missing_label_file.bin", good)


# ----------------------------------------------------------------------------
# S3DIS

def s3dis_line(x, y, z, rgb, label=None):
    values = [ascii_value(x), ascii_value(y), ascii_value(z)] + [str(c) for c in rgb]
    if label is not None:
        values.append(str(label))
    return " ".join(values) + "\n"


def make_s3dis():
    v = "valid/s3dis/"
    put(v + "room_labelled.txt",
        "".join(s3dis_line(x, y, z, c, l) for x, y, z, c, l in POINTS))
    # Tabs and a blank line are whitespace too.
    put(v + "room_unlabelled.txt",
        "".join(s3dis_line(x, y, z, c).replace(" ", "\t", 1) for x, y, z, c, _ in POINTS) + "\n")
    put(v + "room_unlabelled.labels", "".join("%d\n" % p[4] for p in POINTS))
    a = v + "Area_1/office_1/"
    put(a + "office_1.txt", "".join(s3dis_line(x, y, z, c) for x, y, z, c, _ in POINTS))
    put(a + "Annotations/ceiling_1.txt", s3dis_line(0.0, 0.0, 3.0, (10, 20, 30)))
    put(a + "Annotations/chair_2.txt",
        s3dis_line(1.0, 1.0, 0.5, (1, 2, 3)) + s3dis_line(1.25, 1.0, 0.5, (4, 5, 6)))
    put(a + "Annotations/stairs_1.txt", s3dis_line(5.0, 5.0, 1.0, (7, 8, 9)))
    put(a + "Annotations/Icon.md", "not an object file; ignored\n")

    m = "malformed/s3dis/"
    good = "".join(s3dis_line(x, y, z, c, l) for x, y, z, c, l in POINTS)
    put(m + "truncated.txt", good[:-14])
    put(m + "header_line.txt", "x y z r g b label\n" + good)
    put(m + "nan_coordinate.txt", good.replace("0.5 -2.0", "nan -2.0"))
    put(m + "inf_coordinate.txt", good.replace("-1.0 -1.0 1.0", "inf -1.0 1.0"))
    put(m + "mixed_columns.txt", good + s3dis_line(0.0, 0.0, 0.0, (0, 0, 0)))
    put(m + "colour_out_of_range.txt", good.replace("255 0 0", "300 0 0"))
    put(m + "fractional_label.txt", good.replace(" 2\n", " 1.5\n"))
    put(m + "label_count_mismatch.txt",
        "".join(s3dis_line(x, y, z, c) for x, y, z, c, _ in POINTS))
    put(m + "label_count_mismatch.labels", "0\n1\n2\n3\n4\n")
    put(m + "unknown_class/Annotations/spaceship_1.txt", s3dis_line(0.0, 0.0, 0.0, (0, 0, 0)))
    put(m + "bad_object_name/Annotations/ceiling.txt", s3dis_line(0.0, 0.0, 0.0, (0, 0, 0)))
    put(m + "no_objects/Annotations/README", "no object files here\n")
    put(m + "object_with_label/Annotations/chair_1.txt",
        s3dis_line(0.0, 0.0, 0.0, (0, 0, 0), 3))


def main():
    make_ply()
    make_las()
    make_kitti()
    make_s3dis()
    check = "--check" in sys.argv[1:]
    bad = []
    for rel, data in sorted(files.items()):
        path = os.path.join(HERE, rel)
        assert len(data) < 2048, (rel, len(data))
        if check:
            try:
                with open(path, "rb") as f:
                    if f.read() != data:
                        bad.append("differs: " + rel)
            except FileNotFoundError:
                bad.append("missing: " + rel)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
    for top in ("valid", "malformed"):
        for root, _, names in os.walk(os.path.join(HERE, top)):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), HERE)
                if rel not in files:
                    bad.append("not made by this script: " + rel)
    if bad:
        print("\n".join(bad))
        print("run tests/data/make_malformed.py to regenerate" if check else "")
        return 1
    print("%s %d files under %s" % ("checked" if check else "wrote", len(files), HERE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
