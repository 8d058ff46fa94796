"""npyload-inspect against numpy: header facts of numpy-written files, JSON
well-formedness, malformed files, usage errors.

The tool is looked up in $NPYLOAD_BUILD_DIR/tools (default <repo>/build); a
missing binary is a failure, not a skip.
"""
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import numpy.lib.format as npformat
import pytest

from conftest import REPO, built_tool as _tool


@pytest.fixture(scope="module")
def inspect_exe():
    return _tool("npyload-inspect")


def run(exe, *args):
    return subprocess.run([exe, *map(str, args)], capture_output=True,
                          text=True, timeout=60)


def numpy_facts(path):
    """What numpy itself reads from the header."""
    with open(path, "rb") as f:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        else:  # 2.0 and 3.0 share the 4-byte length; headers here are ASCII
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        offset = f.tell()
    return {
        "version": f"{version[0]}.{version[1]}",
        "descr": dtype.str,
        "shape": list(shape),
        "fortran_order": bool(fortran),
        "data_offset": offset,
        "data_bytes": int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
        "file_bytes": os.path.getsize(path),
    }


DTYPES = ["b1", "i1", "u1", "i2", "i4", "i8", "u2", "u4", "u8",
          "f2", "f4", "f8", "c8", "c16"]


def dtype_variants():
    for t in DTYPES:
        if t in ("b1", "i1", "u1"):
            yield "|" + t
        else:
            yield "<" + t
            yield ">" + t


def write(path, arr, version=None):
    with open(path, "wb") as f:
        npformat.write_array(f, arr, version=version, allow_pickle=False)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Many numpy-written files: every dtype and byte order, versions 1.0,
    2.0 and 3.0, 0-d, empty, fortran-ordered, many dimensions."""
    d = tmp_path_factory.mktemp("inspect_corpus")
    rng = np.random.default_rng(0)
    files = []
    for i, dt in enumerate(dtype_variants()):
        shape = [(3,), (2, 5), (4, 1, 3), (2, 3, 4, 5)][i % 4]
        arr = (rng.random(shape) * 100).astype(dt)
        for version in [(1, 0), (2, 0), (3, 0)]:
            name = f"{dt.replace('<', 'le_').replace('>', 'be_').replace('|', 'na_')}" \
                   f"_v{version[0]}.npy"
            files.append(write(d / name, arr, version))
    files.append(write(d / "zero_d.npy", np.array(3.5, dtype="<f8")))
    files.append(write(d / "zero_d_be.npy", np.array(7, dtype=">i2")))
    files.append(write(d / "empty.npy", np.zeros((0,), dtype="<f4")))
    files.append(write(d / "empty_2d.npy", np.zeros((0, 3, 2), dtype=">i8")))
    files.append(write(d / "empty_mid.npy", np.zeros((4, 0, 2), dtype="<u2")))
    files.append(write(d / "fortran.npy",
                       np.asfortranarray(rng.random((3, 4, 5)).astype("<f4"))))
    files.append(write(d / "fortran_v2.npy",
                       np.asfortranarray(rng.random((6, 2)).astype(">c16")),
                       (2, 0)))
    files.append(write(d / "many_dims.npy", np.zeros((1,) * 12 + (2,), "<f4")))
    files.append(write(d / "big_dim.npy", np.zeros((70000,), dtype="|u1")))
    return files


def parse_jsonl(out):
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return [json.loads(ln) for ln in lines]


def test_json_agrees_with_numpy(inspect_exe, corpus):
    r = run(inspect_exe, "--json", *corpus)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    recs = parse_jsonl(r.stdout)
    assert len(recs) == len(corpus)
    for path, rec in zip(corpus, recs):
        assert rec["file"] == str(path)
        want = numpy_facts(path)
        for key, val in want.items():
            assert rec[key] == val, (path.name, key, rec[key], val)
        assert isinstance(rec["shape"], list)
        assert isinstance(rec["fortran_order"], bool)


def test_corpus_covers_versions_and_orders(corpus):
    facts = [numpy_facts(p) for p in corpus]
    assert {f["version"] for f in facts} == {"1.0", "2.0", "3.0"}
    assert any(f["fortran_order"] for f in facts)
    assert any(f["shape"] == [] for f in facts)
    assert any(f["data_bytes"] == 0 for f in facts)
    descrs = {f["descr"] for f in facts}
    for t in DTYPES:
        assert any(d[1:] == t for d in descrs), t
    assert any(d.startswith(">") for d in descrs)


TEXT_RE = re.compile(
    r"^(?P<file>.+): v(?P<ver>\d\.\d) (?P<descr>[<>|][a-z]\d+) "
    r"(?P<shape>\([0-9, ]*\)) (?P<order>[CF])-order "
    r"data_offset=(?P<off>\d+) data_bytes=(?P<nb>\d+)$")


def test_text_output(inspect_exe, corpus):
    r = run(inspect_exe, *corpus)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(corpus)
    for path, line in zip(corpus, lines):
        m = TEXT_RE.match(line)
        assert m, line
        want = numpy_facts(path)
        assert m["file"] == str(path)
        assert m["ver"] == want["version"]
        assert m["descr"] == want["descr"]
        assert m["shape"] == str(tuple(want["shape"]))  # Python's tuple repr
        assert (m["order"] == "F") == want["fortran_order"]
        assert int(m["off"]) == want["data_offset"]
        assert int(m["nb"]) == want["data_bytes"]


def test_text_example_line(inspect_exe, tmp_path):
    p = write(tmp_path / "x.npy", np.zeros((64, 2, 8, 16), dtype="<f4"))
    r = run(inspect_exe, p)
    assert r.returncode == 0
    assert r.stdout == (f"{p}: v1.0 <f4 (64, 2, 8, 16) C-order "
                        f"data_offset=128 data_bytes={64 * 2 * 8 * 16 * 4}\n")


def test_json_escapes_file_names(inspect_exe, tmp_path):
    names = ['q"uote.npy', "back\\slash.npy", "new\nline.npy", "tab\t.npy",
             "ünïcødé.npy", "ctl\x01.npy"]
    paths = [write(tmp_path / n, np.arange(3, dtype="<i4")) for n in names]
    r = run(inspect_exe, "--json", *paths)
    assert r.returncode == 0, r.stderr
    recs = parse_jsonl(r.stdout)
    assert [rec["file"] for rec in recs] == [str(p) for p in paths]


# ---- malformed files ------------------------------------------------------

def raw_npy(header: bytes, data: bytes = b"", version=(1, 0)):
    """An NPY file with a hand-written header dict (padded like numpy)."""
    pre = 10 if version[0] == 1 else 12
    total = pre + len(header) + 1
    pad = (64 - total % 64) % 64
    header = header + b" " * pad + b"\n"
    size = len(header).to_bytes(2 if version[0] == 1 else 4, "little")
    return b"\x93NUMPY" + bytes(version) + size + header + data


@pytest.fixture()
def malformed(tmp_path):
    good = tmp_path / "good.npy"
    write(good, np.arange(6, dtype="<f4").reshape(2, 3))
    bad = {}
    bad["bad_magic"] = b"\x93NUMPX\x01\x00" + good.read_bytes()[8:]
    bad["truncated_data"] = good.read_bytes()[:-5]
    bad["truncated_header"] = good.read_bytes()[:40]
    bad["object_dtype"] = raw_npy(
        b"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }",
        b"\x00" * 16)
    bad["call_in_header"] = raw_npy(
        b"{'descr': '<f4', 'fortran_order': False, "
        b"'shape': tuple([2, 3]), }", b"\x00" * 24)
    bad["import_in_header"] = raw_npy(
        b"{'descr': __import__('os').getcwd(), 'fortran_order': False, "
        b"'shape': (1,), }", b"\x00" * 4)
    bad["empty_file"] = b""
    bad["not_a_dict"] = raw_npy(b"[1, 2, 3]", b"")
    paths = {}
    for name, content in bad.items():
        p = tmp_path / f"{name}.npy"
        p.write_bytes(content)
        paths[name] = p
    # numpy itself refuses each of them (sanity check of the corpus)
    for name, p in paths.items():
        with pytest.raises(Exception):
            np.load(p, allow_pickle=False)
    return good, paths


def test_malformed_each(inspect_exe, malformed):
    good, paths = malformed
    for name, p in paths.items():
        r = run(inspect_exe, p)
        assert r.returncode == 1, (name, r.returncode, r.stdout, r.stderr)
        assert str(p) in r.stderr, (name, r.stderr)
        assert r.stdout == "", (name, r.stdout)


def test_malformed_mixed_with_good_files(inspect_exe, malformed):
    good, paths = malformed
    bad = list(paths.values())
    args = [good, *bad, good]
    r = run(inspect_exe, *args)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith(f"{good}: v1.0 <f4 (2, 3)")
                                   for ln in lines), r.stdout
    for p in bad:
        assert str(p) in r.stderr, (p, r.stderr)
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) >= len(bad)


def test_malformed_json_records(inspect_exe, malformed):
    good, paths = malformed
    bad = list(paths.values())
    r = run(inspect_exe, "--json", good, *bad, good)
    assert r.returncode == 1
    recs = parse_jsonl(r.stdout)
    assert len(recs) == len(bad) + 2
    assert recs[0]["file"] == str(good) and recs[0]["shape"] == [2, 3]
    assert recs[-1]["file"] == str(good) and "error" not in recs[-1]
    for p, rec in zip(bad, recs[1:-1]):
        assert rec["file"] == str(p)
        assert isinstance(rec["error"], str) and rec["error"]
        assert "descr" not in rec
        assert str(p) in r.stderr


def test_missing_file(inspect_exe, tmp_path):
    p = tmp_path / "does_not_exist.npy"
    r = run(inspect_exe, "--json", p)
    assert r.returncode == 1
    assert str(p) in r.stderr
    assert parse_jsonl(r.stdout)[0]["file"] == str(p)


# ---- command line ---------------------------------------------------------

def test_usage_errors(inspect_exe, tmp_path):
    r = run(inspect_exe)
    assert r.returncode == 2 and "usage" in r.stderr.lower()
    r = run(inspect_exe, "--json")
    assert r.returncode == 2
    r = run(inspect_exe, "--bogus", tmp_path / "x.npy")
    assert r.returncode == 2 and "--bogus" in r.stderr


def test_help_and_version(inspect_exe):
    r = run(inspect_exe, "--help")
    assert r.returncode == 0 and "--json" in r.stdout
    r = run(inspect_exe, "--version")
    assert r.returncode == 0
    assert re.fullmatch(r"npyload-inspect \d+\.\d+\.\d+\n", r.stdout)


def test_double_dash_and_options_after_files(inspect_exe, tmp_path):
    p = write(tmp_path / "-dash.npy", np.zeros(2, dtype="<f4"))
    r = subprocess.run([inspect_exe, "--json", "--", "-dash.npy"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert parse_jsonl(r.stdout)[0]["shape"] == [2]
    q = write(tmp_path / "q.npy", np.zeros(3, dtype="<f4"))
    r = run(inspect_exe, q, "--json")
    assert r.returncode == 0
    assert parse_jsonl(r.stdout)[0]["shape"] == [3]


# ---- --verify: every frame of a .npy.zst decoded (issue 21, item 15) ------

def _packed(tmp_path, rows=24):
    """A .npy.zst of 1 KiB samples, 2 per frame (frames 1..12), checksums on."""
    npy = tmp_path / "v.npy"
    np.save(npy, (np.arange(rows * 256, dtype="<f4") % 97).reshape(rows, 256))
    r = run(_tool("npyload-pack"), "--frame-size", 2048, npy)
    assert r.returncode == 0, r.stderr
    return tmp_path / "v.npy.zst"


def _seek_table(data):
    """Frame offsets and the table's position, read by the spec (zstd's
    seekable format), independently of npyload: ([coff...], table_start)."""
    n, desc, magic = struct.unpack_from("<IBI", data, len(data) - 9)
    assert magic == 0x8F92EAB1 and desc & 0x80
    table = len(data) - 9 - 12 * n
    offs = [0]
    for i in range(n):
        offs.append(offs[-1] + struct.unpack_from("<I", data, table + 12 * i)[0])
    return offs, table


def _zstd_t(path):
    """`zstd -t`'s verdict (True: good), or None without the zstd CLI."""
    if shutil.which("zstd") is None:
        return None
    return subprocess.run(["zstd", "-q", "-t", str(path)], capture_output=True,
                          timeout=60).returncode == 0


def _verify(inspect_exe, path):
    r = run(inspect_exe, "--json", "--verify", path)
    return r, parse_jsonl(r.stdout)[-1]


def test_verify_good_file(inspect_exe, tmp_path):
    npyload = pytest.importorskip("npyload", reason="npyload is not installed")
    p = _packed(tmp_path)
    r, rec = _verify(inspect_exe, p)
    assert r.returncode == 0, r.stderr
    assert rec["verified"] is True and rec["checksums"] is True and rec["frames"] == 13
    r = run(inspect_exe, "--verify", p)
    assert r.returncode == 0 and "verified=checksums" in r.stdout
    assert "verified" not in parse_jsonl(run(inspect_exe, "--json", p).stdout)[0]
    d = npyload.inspect(p, verify=True)
    assert d["verified"] is True and d["checksums"] is True
    assert d == {**npyload.inspect(p), "verified": True, "checksums": True}
    # a .npy has no checksums: --verify gives its facts as before
    r = run(inspect_exe, "--json", "--verify", tmp_path / "v.npy")
    assert r.returncode == 0 and "verified" not in parse_jsonl(r.stdout)[0]
    assert "verified" not in npyload.inspect(tmp_path / "v.npy", verify=True)


def test_verify_names_the_first_bad_data_frame(inspect_exe, tmp_path):
    npyload = pytest.importorskip("npyload", reason="npyload is not installed")
    p = _packed(tmp_path)
    data = bytearray(p.read_bytes())
    offs, _ = _seek_table(data)
    data[(offs[3] + offs[4]) // 2] ^= 0x20   # frame 3, and later frame 9
    data[(offs[9] + offs[10]) // 2] ^= 0x20
    p.write_bytes(data)
    # without --verify only the table and frame 0 are read: "fine"
    assert run(inspect_exe, "--json", p).returncode == 0
    r, rec = _verify(inspect_exe, p)
    assert r.returncode == 1
    assert rec["bad_frame"] == 3 and rec["bad_offset"] == offs[3]
    where = f"{p}: frame 3 at byte {offs[3]}: "
    assert where in rec["error"] and where in r.stderr, rec
    r = run(inspect_exe, "--verify", p)
    assert r.returncode == 1 and r.stdout == "" and where in r.stderr
    with pytest.raises(npyload.NpyloadError, match=re.escape(where)):
        npyload.inspect(p, verify=True)
    npyload.inspect(p)  # facts only: still readable


def test_verify_seek_table_checksum_and_truncation(inspect_exe, tmp_path):
    npyload = pytest.importorskip("npyload", reason="npyload is not installed")
    p = _packed(tmp_path)
    good = p.read_bytes()
    offs, table = _seek_table(good)
    data = bytearray(good)
    data[table + 12 * 2 + 8] ^= 0x01         # frame 2's checksum in the table
    p.write_bytes(data)
    r, rec = _verify(inspect_exe, p)
    assert r.returncode == 1 and rec["bad_frame"] == 2, rec
    assert "checksum mismatch" in rec["error"]
    with pytest.raises(npyload.NpyloadError, match="frame 2 at byte"):
        npyload.inspect(p, verify=True)
    p.write_bytes(good[:len(good) - 50])     # the table is at the end
    r, rec = _verify(inspect_exe, p)
    assert r.returncode == 1 and str(p) in rec["error"] and "bad_frame" not in rec


def test_verify_agrees_with_zstd_t(inspect_exe, tmp_path):
    """`zstd -t` is the independent truth for damage inside frames: for a
    flipped byte anywhere in them, both say bad; for the good file, both
    say good."""
    p = _packed(tmp_path, rows=12)
    if _zstd_t(p) is None:
        pytest.skip("the zstd command-line tool is not installed (apt-get install zstd)")
    assert _zstd_t(p) is True and run(inspect_exe, "--verify", p).returncode == 0
    good = p.read_bytes()
    offs, _ = _seek_table(good)
    rng = np.random.default_rng(0)
    for pos in sorted(set(rng.integers(0, offs[-1], size=40).tolist())):
        data = bytearray(good)
        data[pos] ^= 1 << int(rng.integers(0, 8))
        p.write_bytes(data)
        ours = run(inspect_exe, "--verify", p).returncode == 0
        assert ours == _zstd_t(p) == False, f"byte {pos}: verify {ours}"  # noqa: E712


def test_a_manifest_lists_its_files_checked_against_it(inspect_exe, tmp_path):
    """npyload-inspect SPLIT.manifest.json (npyload.write's): one record of
    the dataset's facts, then each file's record (against numpy's reading
    and the writer's own manifest); a file whose size differs from the
    manifest's is its error, and the exit status is 1."""
    npyload = pytest.importorskip("npyload", reason="npyload is not installed (pip install .)")
    a = {"x": np.arange(33, dtype=np.float32).reshape(11, 3), "y": np.arange(11)}
    f = npyload.write(a, tmp_path, samples_per_file=4, progress=False)
    m = tmp_path / "train.manifest.json"
    r = run(inspect_exe, "--json", m)
    if "built without jansson" in r.stderr:
        pytest.skip("npyload-inspect was built without jansson (libjansson-dev)")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    want = json.loads(m.read_text())
    assert recs[0] == {"manifest": str(m), "version": 1, "split": "train",
                       "writer": want["writer"], "samples": 11, "samples_per_file": 4,
                       "files": 6, "fields": ["x", "y"]}
    assert [x["file"] for x in recs[1:]] == f["x"] + f["y"]
    for rec in recs[1:]:
        arr = np.load(rec["file"])
        assert rec["shape"] == list(arr.shape) and rec["descr"] == arr.dtype.str
        assert rec["file_bytes"] == os.path.getsize(rec["file"])
    text = run(inspect_exe, m)
    assert text.returncode == 0 and text.stdout.splitlines()[0].startswith(
        f"{m}: npyload manifest v1, split train, 11 samples (4 per file), 6 files, fields x, y")
    np.save(f["y"][1], np.arange(5))     # 5 samples where the manifest says 4
    bad = run(inspect_exe, m)
    assert bad.returncode == 1
    assert re.search(r"y/train_0001.npy: \d+ bytes, the manifest says \d+", bad.stderr)
    m.write_text(json.dumps({"format": "other"}))
    r = run(inspect_exe, m)
    assert r.returncode == 1 and "not an npyload manifest" in r.stderr
