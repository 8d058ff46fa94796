"""npyload-bench end to end, on a tiny dataset written with numpy.

The binary is found at $NPYLOAD_BUILD_DIR/tools/npyload-bench (default
<repo>/build). The JSON output is checked against bench/schema.json with the
small validator below (and with the jsonschema package too when it happens to
be installed; it is not a dependency).
"""
import json
import os
import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "bench" / "schema.json"


@pytest.fixture(scope="module")
def bench():
    build = Path(os.environ.get("NPYLOAD_BUILD_DIR", REPO / "build"))
    exe = build / "tools" / "npyload-bench"
    if not exe.is_file() or not os.access(exe, os.X_OK):
        pytest.fail(
            f"npyload-bench not found at {exe}: build it "
            f"(cmake -S . -B build && cmake --build build --target npyload-bench) "
            f"or point NPYLOAD_BUILD_DIR at your build directory",
            pytrace=False,
        )
    return exe


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """3 files x 20 samples of the captcha layout, shrunk."""
    root = tmp_path_factory.mktemp("benchdata")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        np.save(root / "images" / f"train_{i:04d}.npy",
                rng.random((20, 2, 16, 32), dtype=np.float32))
        np.save(root / "labels" / f"train_{i:04d}_heatmaps.npy",
                rng.random((20, 2, 4, 8), dtype=np.float32))
        np.save(root / "labels" / f"train_{i:04d}_offsets.npy",
                rng.random((20, 4, 4, 8), dtype=np.float32))
    return root


def fields(root):
    return [f"images={root}/images/*.npy",
            f"heatmaps={root}/labels/*_heatmaps.npy",
            f"offsets={root}/labels/*_offsets.npy"]


def run(exe, *args, timeout=120):
    # stdin/stdout/stderr are pipes: not a terminal, so no progress bar.
    return subprocess.run([str(exe), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


# ---- a small JSON Schema validator (the subset bench/schema.json uses) ----

def _type_ok(v, t):
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "null":
        return v is None
    raise AssertionError(f"schema uses unknown type {t}")


def validate(v, s, path="$"):
    errors = []
    types = s.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        if not any(_type_ok(v, t) for t in types):
            return [f"{path}: {v!r} is not of type {types}"]
    if "const" in s and v != s["const"]:
        errors.append(f"{path}: {v!r} != {s['const']!r}")
    if "enum" in s and v not in s["enum"]:
        errors.append(f"{path}: {v!r} not in {s['enum']}")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "minimum" in s and v < s["minimum"]:
            errors.append(f"{path}: {v} < {s['minimum']}")
        if "maximum" in s and v > s["maximum"]:
            errors.append(f"{path}: {v} > {s['maximum']}")
    if isinstance(v, str):
        if "minLength" in s and len(v) < s["minLength"]:
            errors.append(f"{path}: shorter than {s['minLength']}")
        if "pattern" in s and not re.search(s["pattern"], v):
            errors.append(f"{path}: {v!r} does not match {s['pattern']}")
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                errors.append(f"{path}: missing {k!r}")
        for k, sub in s.get("properties", {}).items():
            if k in v:
                errors += validate(v[k], sub, f"{path}.{k}")
    if isinstance(v, list) and "items" in s:
        for i, item in enumerate(v):
            errors += validate(item, s["items"], f"{path}[{i}]")
    return errors


def check_schema(doc):
    schema = json.loads(SCHEMA.read_text())
    errors = validate(doc, schema)
    assert not errors, "\n".join(errors)
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(doc, schema)


def test_validator_catches_errors():
    schema = json.loads(SCHEMA.read_text())
    assert validate({"tool": "npyload-bench"}, schema)  # missing keys
    assert validate([], schema)
    assert validate(True, {"type": "integer"})
    assert not validate(3, {"type": ["number", "null"], "minimum": 0})


# ---- the runs ----

def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    length, ctype = struct.unpack(">I4s", data[8:16])
    assert ctype == b"IHDR" and length == 13
    w, h, depth, color = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and color == 2
    return w, h


def test_grid_json_plot(bench, dataset, tmp_path):
    out_json = tmp_path / "bench.json"
    out_png = tmp_path / "heat.png"
    p = run(bench, *fields(dataset), "--workers", "1,2", "--prefetch", "1,2",
            "--batches", "5", "--batch-size", "10", "--shuffle",
            "--json", out_json, "--plot", out_png)
    assert p.returncode == 0, p.stdout + p.stderr

    # Not a terminal: no progress bar (no carriage returns, no escapes).
    assert "\r" not in p.stderr and "\x1b[" not in p.stderr and "ETA" not in p.stderr
    assert "\r" not in p.stdout and "\x1b[" not in p.stdout
    assert "pread_copy" in p.stdout  # the ceiling comes first
    line = [l for l in p.stdout.splitlines() if l.startswith("recommend:")]
    assert len(line) == 1, p.stdout
    assert re.match(r"recommend: num_workers=\d+ prefetch=\d+ \(.* GB/s, \d+% of best, .* of slots\)$",
                    line[0]), line[0]

    doc = json.loads(out_json.read_text())
    check_schema(doc)
    runs = doc["runs"]
    assert len(runs) == 4
    assert {(r["workers"], r["prefetch"]) for r in runs} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    for r in runs:
        assert r["ok"], r["error"]
        assert r["batches"] == 5
        assert r["samples"] == 5 * 10  # 60 samples: every batch full
        assert r["io_used"] in ("io_uring", "pread", "mmap")
        assert r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] <= r["latency_ms"]["max"]
        assert r["slot_mib"] > 0
    rec = doc["recommendation"]
    assert rec is not None
    chosen = runs[rec["run_index"]]
    assert (chosen["workers"], chosen["prefetch"]) == (rec["workers"], rec["prefetch"])
    assert rec["line"] == line[0]
    best = max(r["gbps"] for r in runs)
    assert rec["gbps"] >= 0.95 * best
    # No smaller qualifying configuration exists.
    for r in runs:
        if r["gbps"] >= 0.95 * best:
            assert (r["workers"], r["prefetch"]) >= (rec["workers"], rec["prefetch"])
    ceil = {c["name"]: c for c in doc["ceilings"]}
    assert ceil["pread_copy"]["measured"]
    assert doc["machine"]["cores_online"] >= 1
    assert doc["config"]["shuffle"] == "full"
    assert doc["config"]["fields"][0]["sample_shape"] == [2, 16, 32]

    data = out_png.read_bytes()
    w, h = png_size(data)
    assert w >= 300 and h >= 200
    assert len(data) >= w * h * 3  # stored blocks: at least the raw pixels


def test_quiet_compute_svg(bench, dataset, tmp_path):
    out_json = tmp_path / "b.json"
    out_svg = tmp_path / "stall.svg"
    p = run(bench, *fields(dataset), "--workers", "1", "--prefetch", "1,2",
            "--batches", "3", "--batch-size", "8", "--compute-ms", "2",
            "--quiet", "--json", out_json, "--plot", out_svg)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("recommend: num_workers=1 prefetch="), p.stdout
    assert "stall" in lines[0]
    assert p.stderr == ""
    doc = json.loads(out_json.read_text())
    check_schema(doc)
    assert doc["config"]["compute_ms"] == 2
    assert "stall" in doc["recommendation"]["criterion"]
    assert out_svg.read_text().startswith("<svg")


def test_seconds_bound(bench, dataset, tmp_path):
    out_json = tmp_path / "s.json"
    p = run(bench, *fields(dataset), "--workers", "1", "--prefetch", "2",
            "--seconds", "0.2", "--batch-size", "8", "--json", out_json)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out_json.read_text())
    check_schema(doc)
    (r,) = doc["runs"]
    assert r["ok"] and r["wall_s"] >= 0.2 and r["batches"] >= 2
    # Epochs wrap within a time-bounded run: 60 samples are 8 batches.
    assert doc["config"]["seconds"] == pytest.approx(0.2)


def test_errors_are_clear(bench, dataset, tmp_path):
    p = run(bench, f"images={tmp_path}/nothing*.npy")
    assert p.returncode == 2
    assert "no file matches" in p.stderr
    p = run(bench, *fields(dataset), "--workers", "0")
    assert p.returncode == 2 and "--workers" in p.stderr
    p = run(bench, *fields(dataset), "--io", "floppy")
    assert p.returncode == 2 and "floppy" in p.stderr
    p = run(bench)
    assert p.returncode == 2 and "no field" in p.stderr


def test_help(bench):
    p = run(bench, "--help")
    assert p.returncode == 0 and "--compute-ms" in p.stdout
