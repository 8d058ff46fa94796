#!/usr/bin/env python3
"""Writes the golden NPY files of tests/golden and manifest.json.

Most files are written by numpy itself (numpy.save / numpy.lib.format.
write_array); a few are written by hand to cover headers numpy reads but no
longer writes (16-byte alignment, double quotes, Python 2 'L' suffixes, ...).
Every file is then read back by numpy, and manifest.json records numpy's own
reading of it: version, normalised descr (dtype.str), shape, fortran_order,
data offset, data bytes and file size. tests/test_header.c compares
npyload's reading with it field by field.

manifest.json is a JSON array with one object per line and a fixed key order,
so the C test can read it line by line.

Run from anywhere:  python3 tests/golden/make_golden.py
"""
import json
import os
import struct
import sys
import warnings

import numpy as np
from numpy.lib import format as npformat

try:  # numpy >= 2: the implementation moved; the reader is private in both
    from numpy.lib._format_impl import _read_array_header
except ImportError:  # numpy 1.x
    _read_array_header = npformat._read_array_header

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (version the file was written with, written by numpy.save's layout)
written = {}


def data_for(dtype, shape):
    n = int(np.prod(shape)) if len(shape) else 1
    if np.dtype(dtype).kind == "b":
        a = (np.arange(n) % 3 == 0)
    elif np.dtype(dtype).kind == "c":
        a = np.arange(n) + 1j * (np.arange(n) - 2)
    else:
        a = np.arange(n) - (2 if np.dtype(dtype).kind in "if" else 0)
    return a.astype(dtype).reshape(shape)


def save(name, arr, version=None):
    path = os.path.join(HERE, name)
    with open(path, "wb") as f:
        npformat.write_array(f, arr, version=version, allow_pickle=False)
    # np.save's own layout is the one npyload_format_header reproduces.
    written[name] = version is None


def raw(name, version, text, data, align=64, pad_char=" "):
    """A hand-written file: preamble, header `text` padded with spaces and a
    final newline so the data starts at a multiple of `align`, then data."""
    major = version[0]
    enc = "utf8" if major == 3 else "latin1"
    body = text.encode(enc)
    pre = 10 if major == 1 else 12
    total = pre + len(body) + 1
    pad = (-total) % align
    body += pad_char.encode() * pad + b"\n"
    if major == 1:
        head = b"\x93NUMPY" + bytes([1, 0]) + struct.pack("<H", len(body))
    else:
        head = b"\x93NUMPY" + bytes([major, 0]) + struct.pack("<I", len(body))
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(head + body + data)
    written[name] = False


def main():
    for old in os.listdir(HERE):
        if old.endswith(".npy"):
            os.remove(os.path.join(HERE, old))

    # Every dtype, in every byte order numpy writes for it.
    one_byte = ["b1", "i1", "u1"]
    multi = ["i2", "i4", "i8", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]
    for t in one_byte:
        save(f"dt_{t}.npy", data_for("|" + t, (2, 3)))
    for t in multi:
        save(f"dt_{t}_le.npy", data_for("<" + t, (2, 3)))
        save(f"dt_{t}_be.npy", data_for(">" + t, (2, 3)))

    # Format versions written by numpy.
    save("ver2_f4.npy", data_for("<f4", (3, 4)), version=(2, 0))
    save("ver3_f4.npy", data_for("<f4", (3, 4)), version=(3, 0))
    save("ver2_i8_be.npy", data_for(">i8", (5,)), version=(2, 0))

    # Shapes: 0-d, empty, 1-d, many dims, fortran order, the captcha layout's
    # shapes with one sample.
    save("zero_d_f8.npy", np.array(3.5, dtype="<f8"))
    save("zero_d_b1.npy", np.array(True))
    save("empty_0.npy", np.zeros((0,), dtype="<f4"))
    save("empty_3x0.npy", np.zeros((3, 0), dtype="<i2"))
    save("empty_0x5x7.npy", np.zeros((0, 5, 7), dtype=">f8"))
    save("one_d.npy", data_for("<u4", (7,)))
    save("dims_8.npy", data_for("<i1", (1, 2, 1, 2, 1, 2, 1, 2)))
    save("fortran_2d.npy", np.asfortranarray(data_for("<i4", (2, 3))))
    save("fortran_3d_be.npy", np.asfortranarray(data_for(">f4", (2, 3, 2))))
    save("captcha_heatmap_1.npy", data_for("<f4", (1, 2, 8, 16)))

    # Hand-written headers numpy reads.
    f4x6 = data_for("<f4", (2, 3)).tobytes()
    raw("old_align16.npy", (1, 0),
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        f4x6, align=16)
    raw("ver3_utf8_comment.npy", (3, 0),
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
        "  # données — ✓", f4x6)
    raw("dquote_order.npy", (1, 0),
        '{"shape": (2, 2), "fortran_order": False, "descr": "<i4"}',
        data_for("<i4", (2, 2)).tobytes())
    raw("spacing.npy", (1, 0),
        '{\n\t"descr" :\t"<u2" ,\n  "fortran_order":True,\r\n'
        ' "shape":( 3 ,\n 2 , ) ,\n\f}  # trailing comment',
        np.asfortranarray(data_for("<u2", (3, 2))).tobytes(order="F"))
    raw("py2_long.npy", (1, 0),
        "{'descr': '<i8', 'fortran_order': False, 'shape': (2L, 3L), }",
        data_for("<i8", (2, 3)).tobytes())
    raw("py2_long_v2.npy", (2, 0),
        "{'descr': '<i8', 'fortran_order': False, 'shape': (3L,), }",
        data_for("<i8", (3,)).tobytes())
    raw("native_eq.npy", (1, 0),
        "{'descr': '=f8', 'fortran_order': False, 'shape': (2,), }",
        data_for("<f8", (2,)).tobytes())
    raw("pipe_f4.npy", (1, 0),
        "{'descr': '|f4', 'fortran_order': False, 'shape': (2,), }",
        data_for("<f4", (2,)).tobytes())
    raw("bare_i2.npy", (1, 0),
        "{'descr': 'i2', 'fortran_order': False, 'shape': (2,), }",
        data_for("<i2", (2,)).tobytes())
    raw("qmark_bool.npy", (1, 0),
        "{'descr': '?', 'fortran_order': False, 'shape': (4,), }",
        data_for("|b1", (4,)).tobytes())
    raw("lt_i1.npy", (1, 0),
        "{'descr': '<i1', 'fortran_order': False, 'shape': (3,), }",
        data_for("|i1", (3,)).tobytes())
    raw("gt_u1.npy", (1, 0),
        "{'descr': '>u1', 'fortran_order': False, 'shape': (3,), }",
        data_for("|u1", (3,)).tobytes())
    raw("u_prefix.npy", (1, 0),
        "{u'descr': u'<f4', u'fortran_order': False, u'shape': (2, 3)}",
        f4x6)
    raw("trailing_data.npy", (1, 0),
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        f4x6 + b"extra")
    raw("neg_zero_dim.npy", (1, 0),
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-0, 3), }", b"")
    raw("empty_tuple_spaces.npy", (1, 0),
        "{'descr': '<u8', 'fortran_order': False, 'shape': ( ), }",
        data_for("<u8", ()).tobytes())

    rows = []
    for name in sorted(written):
        path = os.path.join(HERE, name)
        with open(path, "rb") as f:
            version = npformat.read_magic(f)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the py2 'L' files warn
                shape, fortran, dtype = _read_array_header(f, version)
            offset = f.tell()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr = np.load(path, allow_pickle=False)
        assert arr.shape == tuple(shape) and arr.dtype == dtype
        rows.append({
            "file": name,
            "version": f"{version[0]}.{version[1]}",
            "descr": dtype.str,
            "itemsize": dtype.itemsize,
            "fortran_order": bool(fortran),
            "shape": [int(d) for d in shape],
            "data_offset": offset,
            "data_bytes": int(arr.nbytes),
            "file_bytes": os.path.getsize(path),
            "numpy_layout": written[name],
        })
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(r, ensure_ascii=True) for r in rows))
        f.write("\n]\n")
    total = sum(r["file_bytes"] for r in rows)
    print(f"{len(rows)} golden files, {total} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
