"""The tools around .npy.zst: npyload-gen's compressibility (issue 14 item
7), npyload-inspect on .npy.zst (item 4) and npyload-bench's decode ceiling
and packing estimate (item 5).

Ratios are sizes, not timings: npyload-gen is seeded, so the band checks
below are deterministic. Tools are looked up in $NPYLOAD_BUILD_DIR/tools
(default <repo>/build); a missing binary is a failure, not a skip; tests
that need the `zstd` CLI skip visibly without it.
"""
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import built_tool as _tool


def run(exe, *args, **kw):
    return subprocess.run([exe, *map(str, args)], capture_output=True,
                          text=True, timeout=300, **kw)


def need_zstd():
    if shutil.which("zstd") is None:
        pytest.skip("the zstd command-line tool is not installed "
                    "(apt-get install zstd)")


def zstd3_bytes(path):
    return len(subprocess.run(["zstd", "-3", "-q", "-c", str(path)], check=True,
                              capture_output=True, timeout=120).stdout)


@pytest.fixture(scope="module")
def captcha(tmp_path_factory):
    """Two captcha files of 16 samples each (seed 0), packed with the
    defaults (level 3, default frame size)."""
    out = tmp_path_factory.mktemp("captcha_zst")
    r = run(_tool("npyload-gen"), "--preset", "captcha", "--out", out,
            "--files", 2, "--samples-per-file", 16, "--seed", 0)
    assert r.returncode == 0, r.stderr
    npys = sorted(str(p) for p in out.rglob("*.npy"))
    assert len(npys) == 6
    r = run(_tool("npyload-pack"), *npys)
    assert r.returncode == 0, r.stderr
    return out, npys


def sizes(npys, suffix=""):
    return sum(os.path.getsize(p + suffix) for p in npys)


def test_gen_captcha_compresses_like_natural_photos(captcha):
    # Natural 8-bit gray photos as float32 + the all-ones mask: about 8x at
    # zstd -3 in per-sample frames (the gray plane about 4x); heatmaps and
    # offsets hundreds of times. The preset as a whole must land in 7-10x,
    # never the 16x that 16-level textures gave.
    out, npys = captcha
    total = sizes(npys) / sizes(npys, ".zst")
    assert 7.0 <= total <= 10.0, total
    images = [p for p in npys if "/images/" in p]
    img = sizes(images) / sizes(images, ".zst")
    assert 6.0 <= img <= 9.0, img
    # the gray plane alone, one sample per frame as npyload-pack does
    a = np.load(images[0])
    gray = [a[i, 0].tobytes() for i in range(4)]
    need_zstd()
    packed = sum(len(subprocess.run(["zstd", "-3", "-q", "-c"], input=g,
                                    capture_output=True, check=True).stdout)
                 for g in gray)
    plane = sum(len(g) for g in gray) / packed
    assert 3.0 <= plane <= 5.0, plane


def test_gen_captcha_ratio_with_stock_zstd(captcha):
    # the same band with the stock CLI on the whole files (one frame each)
    need_zstd()
    out, npys = captcha
    total = sizes(npys) / sum(zstd3_bytes(p) for p in npys)
    assert 7.0 <= total <= 10.0, total


# ---- npyload-inspect on .npy.zst ----

NPY_KEYS = ["file", "version", "descr", "shape", "fortran_order", "itemsize",
            "header_len", "data_offset", "data_bytes", "file_bytes"]
ZST_KEYS = ["compressed_bytes", "ratio", "frames", "samples_per_frame"]


def inspect_json(*paths):
    r = run(_tool("npyload-inspect"), "--json", *paths)
    return r, [json.loads(line) for line in r.stdout.splitlines()]


def arrays():
    rng = np.random.default_rng(3)
    yield "f4_le", rng.standard_normal((40, 2, 16, 32)).astype("<f4")
    yield "f8_be", rng.standard_normal((9, 3, 5)).astype(">f8")
    yield "u1", rng.integers(0, 256, (300, 17), dtype=np.uint8)
    yield "i2_be", np.arange(600, dtype=">i2").reshape(100, 6)
    yield "c8", (rng.standard_normal((7, 4)) + 1j).astype("<c8")
    yield "bool", rng.integers(0, 2, (33,)).astype(bool)
    yield "scalar", np.array(2.5, dtype="<f4")
    yield "empty", np.zeros((0, 4), dtype="<f4")
    yield "v2_header", np.arange(24, dtype="<u4").reshape(6, 4)


@pytest.mark.parametrize("name,arr", list(arrays()), ids=[n for n, _ in arrays()])
@pytest.mark.parametrize("frame_size", [None, 64])
def test_inspect_zst_same_facts_as_npy(tmp_path, name, arr, frame_size):
    npy = tmp_path / f"{name}.npy"
    with open(npy, "wb") as f:  # v2_header: a version 2.0 header
        np.lib.format.write_array(f, arr, version=(2, 0) if name == "v2_header" else None)
    opts = [] if frame_size is None else ["--frame-size", frame_size]
    r = run(_tool("npyload-pack"), *opts, npy)
    assert r.returncode == 0, r.stderr
    zst = str(npy) + ".zst"
    r, recs = inspect_json(npy, zst)
    assert r.returncode == 0, r.stderr
    plain, packed = recs
    assert list(plain) == NPY_KEYS
    assert list(packed) == NPY_KEYS + ZST_KEYS
    for k in NPY_KEYS[1:]:
        assert packed[k] == plain[k], k
    assert plain["file_bytes"] == os.path.getsize(npy)
    assert packed["compressed_bytes"] == os.path.getsize(zst)
    assert packed["ratio"] == pytest.approx(
        os.path.getsize(npy) / os.path.getsize(zst), rel=1e-3)
    # frames and samples per frame, from the pack rule: the fewest whole
    # samples reaching the frame size (default 128 KiB), frame 0 the header
    rows = arr.shape[0] if arr.ndim else 1
    row_bytes = arr.itemsize * (int(np.prod(arr.shape[1:])) if arr.ndim else 1)
    target = frame_size or 128 << 10
    spf = max(1, -(-target // row_bytes)) if row_bytes else 0
    if rows == 0 or row_bytes == 0:
        assert packed["frames"] == 1 and packed["samples_per_frame"] == 0
    else:
        spf = min(spf, rows)
        assert packed["samples_per_frame"] == spf
        assert packed["frames"] == 1 + -(-rows // spf)
    # the text form: the .npy's line, then the compressed facts
    r = run(_tool("npyload-inspect"), npy, zst)
    assert r.returncode == 0, r.stderr
    a, b = r.stdout.splitlines()
    assert b.startswith(zst + ":")
    assert b[len(zst):].startswith(a[len(str(npy)):])
    assert f"compressed_bytes={os.path.getsize(zst)} " in b
    assert f"frames={packed['frames']} samples_per_frame=" in b
    # Python's npyload.inspect gives the same facts as the CLI
    npyload = pytest.importorskip("npyload", reason="npyload is not installed")
    pn, pz = npyload.inspect(str(npy)), npyload.inspect(zst)
    assert list(pz) == list(pn) + ZST_KEYS
    for k in pn:
        assert pz[k] == pn[k], k
    assert "%d.%d" % pn["version"] == plain["version"]
    for k in NPY_KEYS[2:]:
        assert (list(pn[k]) if isinstance(pn[k], tuple) else pn[k]) == plain[k], k
    for k in ZST_KEYS:
        assert pz[k] == pytest.approx(packed[k], rel=1e-3), k


def test_inspect_captcha_zst(captcha):
    out, npys = captcha
    r, recs = inspect_json(*[p + ".zst" for p in npys])
    assert r.returncode == 0, r.stderr
    spf = {"heatmaps": 2, "offsets": 1}
    for p, rec in zip(npys, recs):
        kind = "heatmaps" if "heatmaps" in p else "offsets" if "offsets" in p else "images"
        assert rec["samples_per_frame"] == spf.get(kind, 1)
        assert rec["frames"] == 1 + 16 // rec["samples_per_frame"]


def _zst_file(tmp_path, rows=20):
    npy = tmp_path / "d.npy"
    np.save(npy, np.arange(rows * 1024, dtype="<f4").reshape(rows, 1024))
    r = run(_tool("npyload-pack"), "--frame-size", 8192, npy)
    assert r.returncode == 0, r.stderr
    return tmp_path / "d.npy.zst"


def _expect_error(path, *words):
    npyload = pytest.importorskip("npyload", reason="npyload is not installed")
    with pytest.raises(npyload.NpyloadError) as ei:  # Python's inspect too
        npyload.inspect(path)
    assert str(path) in str(ei.value)
    r, recs = inspect_json(path)
    assert r.returncode == 1
    assert recs and recs[-1]["file"] == str(path) and "error" in recs[-1]
    assert str(path) in r.stderr
    for w in words:
        assert w in recs[-1]["error"], recs[-1]["error"]
    # the text mode says the same on stderr, with nothing on stdout
    r = run(_tool("npyload-inspect"), path)
    assert r.returncode == 1 and r.stdout == ""
    assert str(path) in r.stderr


def test_inspect_zst_malformed_tables(tmp_path):
    good = _zst_file(tmp_path)
    data = bytearray(good.read_bytes())
    # footer: Number_Of_Frames u32, Descriptor u8, magic u32
    nframes, = struct.unpack_from("<I", data, len(data) - 9)

    huge = bytearray(data)
    struct.pack_into("<I", huge, len(huge) - 9, 0x7FFFFFFF)
    (tmp_path / "huge.npy.zst").write_bytes(huge)
    _expect_error(tmp_path / "huge.npy.zst", "frames")

    wrong = bytearray(data)  # one frame fewer than the table holds
    struct.pack_into("<I", wrong, len(wrong) - 9, nframes - 1)
    (tmp_path / "wrong.npy.zst").write_bytes(wrong)
    _expect_error(tmp_path / "wrong.npy.zst")

    reserved = bytearray(data)
    reserved[-5] |= 0x04
    (tmp_path / "reserved.npy.zst").write_bytes(reserved)
    _expect_error(tmp_path / "reserved.npy.zst")

    # an entry's decompressed size that splits a sample (entries start after
    # the 8-byte skippable header; 12 bytes each with checksums)
    table = len(data) - 9 - 12 * nframes
    split = bytearray(data)
    d1 = table + 12 * 1 + 4
    struct.pack_into("<I", split, d1, struct.unpack_from("<I", split, d1)[0] - 4)
    (tmp_path / "split.npy.zst").write_bytes(split)
    _expect_error(tmp_path / "split.npy.zst")

    (tmp_path / "trunc.npy.zst").write_bytes(data[:len(data) // 2])
    _expect_error(tmp_path / "trunc.npy.zst", "seek table")

    # a plain zstd file, no seek table: says how to repack
    need_zstd()
    plain = tmp_path / "plain.npy.zst"
    subprocess.run(["zstd", "-q", "-3", str(tmp_path / "d.npy"), "-o", str(plain)],
                   check=True)
    _expect_error(plain, "npyload-pack")


def test_inspect_zst_mixed_with_npy_and_bad_files(tmp_path):
    good = _zst_file(tmp_path)
    bad = tmp_path / "bad.npy.zst"
    bad.write_bytes(good.read_bytes()[:-3])
    r, recs = inspect_json(tmp_path / "d.npy", bad, good)
    assert r.returncode == 1
    assert [("error" in x) for x in recs] == [False, True, False]
    assert recs[2]["frames"] == 1 + 20 // 2


# ---- a field holding FILE.npy and FILE.npy.zst (issue 21, item 14) ----

def test_loader_refuses_a_field_holding_a_file_and_its_packed_twin(tmp_path):
    """Packing without --rm, then a glob over the directory: every sample
    would come twice. Refused at start naming both files, for a glob and a
    list; one form alone loads and equals numpy."""
    npyload = pytest.importorskip("npyload", reason="npyload is not installed")
    arrs = [np.arange(i * 40, (i + 1) * 40, dtype="<i4").reshape(10, 4) for i in range(2)]
    npys = []
    for i, a in enumerate(arrs):
        npys.append(tmp_path / f"x_{i:04d}.npy")
        np.save(npys[-1], a)
    r = run(_tool("npyload-pack"), *npys)  # no --rm: the .npy files stay
    assert r.returncode == 0, r.stderr
    zst1 = str(npys[1]) + ".zst"
    for spec in (str(tmp_path / "x_*"), [str(npys[0]), zst1, str(npys[1])]):
        with pytest.raises(npyload.NpyloadError) as ei:
            for _ in npyload.Loader({"x": spec}, batch_size=4):
                pass
        msg = str(ei.value)
        assert "twice" in msg, msg
        assert any(str(n) in msg and f"{n}.zst" in msg for n in npys), msg
    for pattern in ("x_*.npy", "x_*.npy.zst"):
        got = [np.array(np.asarray(b["x"])) for b in  # copies: slots go back
               npyload.Loader({"x": str(tmp_path / pattern)}, batch_size=4)]
        np.testing.assert_array_equal(np.concatenate(got), np.concatenate(arrs))


# ---- npyload-bench: packing estimate (raw fields), decode ceiling (packed) ----

def _bench(*args):
    return run(_tool("npyload-bench"), *args, "--workers", 1, "--prefetch", 1,
               "--batches", 3, "--batch-size", 8)


def _schema_check(doc):
    jsonschema = pytest.importorskip("jsonschema")
    from conftest import REPO
    schema = json.loads((REPO / "bench" / "schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)


def _captcha_fields(out, suffix=".npy"):
    return [f"images={out}/images/train/*{suffix}",
            f"heatmaps={out}/labels/train/*_heatmaps{suffix}",
            f"offsets={out}/labels/train/*_offsets{suffix}"]


def test_bench_estimates_packing_of_raw_fields(captcha, tmp_path):
    out, npys = captcha
    js = tmp_path / "b.json"
    r = _bench(*_captcha_fields(out), "--json", js)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(js.read_text())
    _schema_check(doc)
    z = doc["compression"]
    assert z["mode"] == "estimate" and z["valid"] is True
    assert z["level"] == 3 and z["frame_size"] == 128 << 10
    assert z["threads"] == doc["machine"]["cores_allowed"]
    assert z["decode_gbps"] > 0 and z["compress_mbps_per_core"] > 0
    assert z["decode_gbps_per_core"] == pytest.approx(z["decode_gbps"] / z["threads"], rel=1e-4)
    # the sampled ratio against what npyload-pack really gave on these files
    # (same level, same frame rule): images sampled across their frames
    by = {f["name"]: f for f in z["fields"]}
    assert [f["name"] for f in z["fields"]] == ["images", "heatmaps", "offsets"]
    assert by["images"]["samples_per_frame"] == 1
    assert by["heatmaps"]["samples_per_frame"] == 2
    imgs = [p for p in npys if "/images/" in p]
    real = sizes(imgs) / sizes(imgs, ".zst")
    assert by["images"]["ratio"] == pytest.approx(real, rel=0.1)
    real_all = sizes(npys) / sizes(npys, ".zst")
    assert z["ratio"] == pytest.approx(real_all, rel=0.15)
    # the dataset fits in the page cache here: raw warm comes from the runs
    assert z["raw_warm_source"].startswith("runs")
    assert z["raw_warm_samples_per_s"] == pytest.approx(
        max(x["samples_per_s"] for x in doc["runs"] if x["ok"]), rel=1e-4)
    sample_bytes = sum(f["sample_bytes"] for f in doc["config"]["fields"])
    if z["packed_cpu_ns_per_sample"] is not None:
        # Like with like (issue 40): the same workers spend on a packed
        # sample the copy of ratio-times fewer bytes, the decode and the same
        # transforms; the warm rate scales by the CPU time per sample.
        raw, t = z["raw_cpu_ns_per_sample"], z["transform_ns_per_sample"]
        packed = (raw - t) / z["ratio"] + sample_bytes / z["decode_gbps_per_core"] + t
        assert z["packed_cpu_ns_per_sample"] == pytest.approx(packed, rel=1e-3)
        assert 1 <= z["workers"] <= doc["machine"]["cores_allowed"]
        assert z["expected_warm_samples_per_s"] == pytest.approx(
            z["raw_warm_samples_per_s"] * raw / packed, rel=1e-3)
    else:
        assert z["expected_warm_samples_per_s"] == pytest.approx(
            min(z["raw_warm_samples_per_s"] * z["ratio"], z["decode_gbps"] * 1e9 / sample_bytes),
            rel=1e-4)
    assert z["pays"] in (True, False)
    assert z["verdict"].startswith("packing ")
    # the text report: the compression section and the verdict line
    assert "compression: estimate for npyload-pack -l 3" in r.stdout
    assert z["verdict"] in r.stdout


def test_bench_decode_ceiling_of_packed_fields(captcha, tmp_path):
    out, npys = captcha
    js = tmp_path / "b.json"
    # images and heatmaps packed, offsets raw: a mixed batch
    r = _bench(f"images={out}/images/train/*.npy.zst",
               f"heatmaps={out}/labels/train/*_heatmaps.npy.zst",
               f"offsets={out}/labels/train/*_offsets.npy", "--json", js)
    doc = json.loads(js.read_text())
    _schema_check(doc)
    assert doc["config"]["fields"][0]["sample_bytes"] == 2 * 256 * 512 * 4
    assert doc["config"]["num_samples"] == 32
    ce = {c["name"]: c for c in doc["ceilings"]}
    assert ce["pread_copy"]["measured"] is False
    assert ce["zst_decode"]["measured"] is True and ce["zst_decode"]["gbps"] > 0
    assert ce["zst_decode"]["threads"] == doc["machine"]["cores_allowed"]
    assert doc["config"]["ceiling_reference"] == "zst_decode"
    z = doc["compression"]
    assert z["mode"] == "packed" and z["pays"] is None
    assert z["decode_gbps"] == pytest.approx(ce["zst_decode"]["gbps"])
    by = {f["name"]: f for f in z["fields"]}
    assert by["images"]["compressed"] and by["heatmaps"]["compressed"]
    assert not by["offsets"]["compressed"] and by["offsets"]["zst_bytes"] == 0
    imgs = [p for p in npys if "/images/" in p]
    # the frames sampled are the files' own: their ratio is close to the files'
    assert by["images"]["ratio"] == pytest.approx(
        sizes(imgs) / sizes(imgs, ".zst"), rel=0.1)
    assert z["verdict"].startswith("packed fields: the cores decode")
    # runs compare with the decode ceiling when the loader reads .npy.zst,
    # and carry the loader's decode stats: frames read and decompressed to
    # at least the packed fields' rows
    assert any(run_["ok"] for run_ in doc["runs"])
    for run_ in doc["runs"]:
        if run_["ok"]:
            assert run_["frac_of_ceiling"] == pytest.approx(
                run_["gbps"] / ce["zst_decode"]["gbps"], rel=1e-3)
            assert 0 < run_["compressed_bytes_read"] < run_["decompressed_bytes"]
            assert run_["decode_ns"] > 0


def test_bench_refuses_a_damaged_packed_field(captcha, tmp_path):
    out, npys = captcha
    bad = tmp_path / "bad.npy.zst"
    data = bytearray(Path(npys[0] + ".zst").read_bytes())
    struct.pack_into("<I", data, len(data) - 9, 0x7FFFFFFF)
    bad.write_bytes(data)
    r = _bench(f"images={bad}")
    assert r.returncode == 2
    assert str(bad) in r.stderr and "frames" in r.stderr
