#!/usr/bin/env python3
"""Writes the malformed NPY corpus of tests/malformed and manifest.json.

One file per problem. manifest.json (a JSON array, one object per line, fixed
key order, read line by line by tests/test_header.c) gives for each file the
error npyload must return ("code", an NPYLOAD_E* name without the prefix) and
a fragment its message must contain (besides the file's name). "numpy" records
what numpy does with the file ("refuses" or "accepts"): the few that numpy
accepts are refused by npyload on purpose (unsupported dtypes, escapes).

Run from anywhere:  python3 tests/malformed/make_malformed.py
"""
import json
import os
import struct
import sys
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
rows = []

GOOD = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
F4X6 = bytes(24)


def header_bytes(version, text, align=64):
    major, minor = version
    body = text.encode("utf8" if major == 3 else "latin1") if isinstance(text, str) else text
    pre = 10 if major == 1 else 12
    pad = (-(pre + len(body) + 1)) % align
    body += b" " * pad + b"\n"
    size = struct.pack("<H" if major == 1 else "<I", len(body))
    return b"\x93NUMPY" + bytes([major, minor]) + size + body


def put(name, content, code, fragment):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(content)
    rows.append((name, code, fragment))


def hdr(name, text, code, fragment, data=F4X6, version=(1, 0)):
    put(name, header_bytes(version, text) + data, code, fragment)


def main():
    for old in os.listdir(HERE):
        if old.endswith(".npy"):
            os.remove(os.path.join(HERE, old))

    good = header_bytes((1, 0), GOOD)

    # Preamble
    put("bad_magic.npy", b"\x93NUMPZ" + good[6:] + F4X6, "FORMAT", "not an NPY file")
    put("zip_magic.npy", b"PK\x03\x04" + bytes(60), "FORMAT", "not an NPY file")
    put("empty_file.npy", b"", "TRUNCATED", "too short for an NPY preamble")
    put("short_preamble.npy", b"\x93NUMPY\x01", "TRUNCATED", "too short for an NPY preamble")
    put("short_v2_preamble.npy", b"\x93NUMPY\x02\x00\x40\x00", "TRUNCATED",
        "too short for a version 2.0 NPY preamble")
    put("version_4.npy", b"\x93NUMPY\x04\x00" + good[8:] + F4X6, "UNSUPPORTED",
        "version 4.0 is not supported")
    put("version_1_1.npy", b"\x93NUMPY\x01\x01" + good[8:] + F4X6, "UNSUPPORTED",
        "version 1.1 is not supported")
    put("header_past_eof.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", 1000) + GOOD.encode(),
        "TRUNCATED", "runs past the end of the file")
    put("header_too_big.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", 2 << 20) + GOOD.encode(),
        "TOOBIG", "is over the limit")
    put("header_cut.npy", good[:40], "TRUNCATED", "runs past the end of the file")

    # Data
    hdr("data_short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1024,), }",
        "TRUNCATED", "header says 4096 bytes of data from offset 128, file holds 228 bytes",
        data=bytes(100))
    hdr("data_missing.npy", GOOD, "TRUNCATED", "header says 24 bytes of data", data=b"")

    # Dict syntax
    hdr("not_dict.npy", "['descr', 'fortran_order', 'shape']", "FORMAT", "not a dict literal")
    hdr("empty_header.npy", "", "FORMAT", "not a dict literal")
    hdr("unclosed_dict.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ",
        "FORMAT", "expected a string key or '}'")
    hdr("missing_colon.npy", "{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "expected ':' after key 'descr'")
    hdr("missing_comma.npy", "{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "expected ',' or '}' after the value of 'descr'")
    hdr("double_comma.npy", "{'descr': '<f4',, 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "expected a string key")
    hdr("trailing_garbage.npy", GOOD + " x", "FORMAT", "unexpected text after the header dict")
    hdr("misplaced_quote.npy", "{'descr: '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "unknown key")
    hdr("unterminated_eol.npy", "{'descr': '<f4\n', 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "unterminated string")
    hdr("bytes_key.npy", "{b'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "expected a string key")
    hdr("int_key.npy", "{1: '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "expected a string key")
    hdr("nul_byte.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\0",
        "FORMAT", "NUL byte in the header")
    hdr("escape_in_descr.npy", "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2, 3), }",
        "UNSUPPORTED", "escape sequences")

    # Keys
    hdr("missing_shape.npy", "{'descr': '<f4', 'fortran_order': False, }",
        "FORMAT", "missing key 'shape'")
    hdr("missing_descr.npy", "{'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "missing key 'descr'")
    hdr("duplicate_descr.npy",
        "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "duplicate key 'descr'")
    hdr("extra_key.npy",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'foo': 1}",
        "FORMAT", "unknown key 'foo'")
    hdr("key_case.npy", "{'Descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "unknown key 'Descr'")

    # Values: not literals
    hdr("call_descr.npy",
        "{'descr': np.dtype('<f4'), 'fortran_order': False, 'shape': (2, 3), }",
        "FORMAT", "descr must be a string literal")
    hdr("call_fortran.npy",
        "{'descr': '<f4', 'fortran_order': bool(0), 'shape': (2, 3), }",
        "FORMAT", "fortran_order must be True or False")
    hdr("fortran_lower.npy", "{'descr': '<f4', 'fortran_order': false, 'shape': (2, 3), }",
        "FORMAT", "fortran_order must be True or False")
    hdr("fortran_int.npy", "{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }",
        "FORMAT", "fortran_order must be True or False")
    hdr("fortran_str.npy", "{'descr': '<f4', 'fortran_order': 'False', 'shape': (2, 3), }",
        "FORMAT", "fortran_order must be True or False")

    # Shapes
    hdr("shape_expr.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2*3,), }",
        "FORMAT", "dimension 0 is not a plain integer")
    hdr("shape_name.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (n, 3), }",
        "FORMAT", "dimension 0 is not a plain integer")
    hdr("shape_call.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (int(2), 3), }",
        "FORMAT", "dimension 0 is not a plain integer")
    hdr("shape_negative.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1), }",
        "FORMAT", "shape (3, -1): dimension 1 is negative")
    hdr("shape_float.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5, 3), }",
        "FORMAT", "dimension 0 is not a plain integer")
    hdr("shape_hex.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0x3), }",
        "FORMAT", "dimension 1 is not a plain integer")
    hdr("shape_leading_zero.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 03), }",
        "FORMAT", "leading zeros")
    hdr("shape_int.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (6), }",
        "FORMAT", "shape (6) is the int 6, not a tuple")
    hdr("shape_list.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }",
        "FORMAT", "shape must be a tuple, not a list")
    hdr("shape_bare_int.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': 6, }",
        "FORMAT", "shape must be a tuple literal")
    hdr("shape_nested.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': ((2, 3),), }",
        "FORMAT", "dimension 0 is not a plain integer")
    hdr("shape_unclosed.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, }",
        "FORMAT", "dimension 2 is not a plain integer")
    hdr("shape_33_dims.npy",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1, " * 33 + "), }",
        "TOOBIG", "more than 32 dimensions", data=bytes(4))
    hdr("shape_overflow.npy",
        "{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }",
        "TOOBIG", "overflows 64 bits")
    hdr("shape_overflow_int64.npy",
        "{'descr': '|u1', 'fortran_order': False, 'shape': (4611686018427387904, 2), }",
        "TOOBIG", "overflows 64 bits")
    hdr("shape_dim_too_big.npy",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
        "TOOBIG", "dimension 0 (99999999999999999999) does not fit 64 bits")
    hdr("shape_long_v3.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }",
        "FORMAT", "'L' suffix", version=(3, 0))
    hdr("bad_utf8_v3.npy", GOOD.encode() + b" # \xff\xfe", "FORMAT", "not valid UTF-8",
        version=(3, 0))

    # dtypes
    for name, descr, code, frag in [
        ("dtype_object.npy", "|O", "UNSUPPORTED", "object dtype"),
        ("dtype_unicode.npy", "<U4", "UNSUPPORTED", "unicode string dtype"),
        ("dtype_bytes.npy", "|S4", "UNSUPPORTED", "byte string dtype"),
        ("dtype_void.npy", "|V8", "UNSUPPORTED", "void (raw bytes) dtype"),
        ("dtype_datetime.npy", "<M8[ns]", "UNSUPPORTED", "datetime64"),
        ("dtype_timedelta.npy", "<m8[s]", "UNSUPPORTED", "timedelta64"),
        ("dtype_longdouble.npy", "<f16", "UNSUPPORTED", "long double"),
        ("dtype_no_size.npy", "<f", "UNSUPPORTED", "has no item size"),
        ("dtype_unknown.npy", "xyz", "FORMAT", "descr 'xyz' is not a numpy dtype"),
        ("dtype_bad_size.npy", "<i3", "FORMAT", "descr '<i3' is not a numpy dtype"),
        ("dtype_bool_2.npy", "|b2", "FORMAT", "descr '|b2' is not a numpy dtype"),
        ("dtype_empty.npy", "", "FORMAT", "descr '' is not a numpy dtype"),
    ]:
        hdr(name, "{'descr': '%s', 'fortran_order': False, 'shape': (2, 3), }" % descr,
            code, frag, data=bytes(2 * 3 * 16))
    hdr("dtype_structured.npy",
        "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,), }",
        "UNSUPPORTED", "structured dtypes are not supported")
    hdr("dtype_subarray.npy",
        "{'descr': ('<f4', (2,)), 'fortran_order': False, 'shape': (2,), }",
        "UNSUPPORTED", "subarray dtypes are not supported")

    out = []
    for name, code, frag in rows:
        path = os.path.join(HERE, name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                np.load(path, allow_pickle=False)
            verdict = "accepts"
        except Exception:
            verdict = "refuses"
        out.append({"file": name, "code": code, "fragment": frag, "numpy": verdict})
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(r, ensure_ascii=True) for r in out))
        f.write("\n]\n")
    acc = [r["file"] for r in out if r["numpy"] == "accepts"]
    print(f"{len(out)} malformed files; numpy accepts {len(acc)}: {acc}", file=sys.stderr)


if __name__ == "__main__":
    main()
