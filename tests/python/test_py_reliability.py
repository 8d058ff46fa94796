"""Reliability of the Python binding (issue 11): paths and messages that are
not UTF-8, and what a closed loader keeps alive."""
import gc
import os

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")


# ---- paths and messages that are not UTF-8 (issue 11 item 7) ----

@pytest.fixture
def latin1_dir(tmp_path):
    """A directory whose name holds the byte 0xff (not UTF-8), with two NPY
    files, one of which is also named with a non-UTF-8 byte."""
    d = os.path.join(os.fsencode(tmp_path), b"data\xff")
    os.mkdir(d)
    a = np.arange(24, dtype=np.int32).reshape(6, 4)
    for name, part in ((b"part_0.npy", a[:4]), (b"part_\xfe1.npy", a[4:])):
        with open(os.path.join(d, name), "wb") as f:  # np.save takes no bytes path
            np.save(f, part)
    return d, a


def test_bytes_paths_load(latin1_dir):
    d, a = latin1_dir
    paths = [os.path.join(d, b"part_0.npy"), os.path.join(d, b"part_\xfe1.npy")]
    for spec in (paths, os.path.join(d, b"part_*.npy")):
        loader = npyload.Loader({"x": spec}, batch_size=4, output="numpy")
        got = np.concatenate([b["x"].copy() for b in loader])
        np.testing.assert_array_equal(got, a)
        loader.close()


def test_surrogate_str_paths_and_field_name(latin1_dir):
    """str paths with surrogate escapes (what os.listdir gives for such names)
    and a field name with one both make the round trip unchanged."""
    d, a = latin1_dir
    sd = os.fsdecode(d)
    name = "f\udcff"
    loader = npyload.Loader({name: os.path.join(sd, "part_*.npy")}, batch_size=6,
                            output="numpy")
    assert loader.field_names == (name,)
    assert list(loader.field_engines()) == [name]  # before the first iter()
    b = next(iter(loader))
    np.testing.assert_array_equal(b[name], a)
    assert list(loader.field_engines()) == [name]  # the started loader's
    del b
    loader.close()


def test_missing_non_utf8_file_is_npyload_error(latin1_dir):
    d, _ = latin1_dir
    missing = os.path.join(d, b"gone\xfe.npy")
    with pytest.raises(npyload.NpyloadError) as ei:
        npyload.Loader({"x": [missing]}, batch_size=1, output="numpy")
    msg = str(ei.value)
    assert os.fsdecode(missing) in msg          # surrogate-escaped name
    assert os.fsencode(missing) in os.fsencode(msg)  # the exact bytes back
    assert ei.value.code is not None and ei.value.code < 0


def test_glob_without_match_non_utf8(latin1_dir):
    d, _ = latin1_dir
    pattern = os.path.join(d, b"nothing\xfd_*.npy")
    with pytest.raises(npyload.NpyloadError) as ei:
        npyload.Loader({"x": pattern}, batch_size=1, output="numpy")
    assert os.fsencode(pattern) in os.fsencode(str(ei.value))


def test_inspect_and_load_non_utf8(latin1_dir):
    d, a = latin1_dir
    p = os.path.join(d, b"part_\xfe1.npy")
    assert npyload.inspect(p)["shape"] == (2, 4)
    assert npyload.inspect(os.fsdecode(p))["shape"] == (2, 4)
    np.testing.assert_array_equal(npyload.load(p), a[4:])
    np.testing.assert_array_equal(npyload.load(p, mmap=False), a[4:])
    with pytest.raises(npyload.NpyloadError) as ei:
        npyload.inspect(os.path.join(d, b"nope\xfe.npy"))
    assert os.fsdecode(os.path.join(d, b"nope\xfe.npy")) in str(ei.value)


def test_low_level_accepts_bytes_name_and_glob(latin1_dir):
    d, a = latin1_dir
    c = npyload._npyload.Loader()
    c.add_field(b"x\xff", os.path.join(d, b"part_*.npy"))
    c.set(npyload._npyload.OPT_BATCH_SIZE, 6)
    c.start()
    assert c.field_names == ("x\udcff",)
    raw = c.next()
    np.testing.assert_array_equal(np.asarray(raw.field("x\udcff")), a)
    del raw
    c.close()


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_long_non_ascii_path_cut_message(tmp_path, extra):
    """A message longer than the library's buffer (1023 bytes) is cut; with
    3-byte characters in the path one of these lengths cuts inside a
    character. The result is still an NpyloadError naming the path."""
    comp = "日本語" * 20                      # 180 bytes per component
    p = os.path.join(str(tmp_path), *([comp] * 6)) + "x" * extra + "/a.npy"
    assert len(os.fsencode(p)) > 1100
    with pytest.raises(npyload.NpyloadError) as ei:
        npyload.Loader({"x": [p]}, batch_size=1, output="numpy")
    msg = str(ei.value)
    raw = os.fsencode(msg)
    assert len(raw) < len(os.fsencode(p)) + 200
    assert os.fsencode(p)[:400] in raw
    with pytest.raises(npyload.NpyloadError) as ei:
        npyload.inspect(p)
    assert os.fsencode(p)[:400] in os.fsencode(str(ei.value))


# ---- a closed loader frees what no live batch needs (issue 11 item 11) ----

def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def _many_files_dataset(root, files=24, rows=3):
    """Fields spread over many files, so a loader that kept its descriptors
    would show clearly in /proc/self/fd."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((files * rows, 4, 8)).astype(np.float32)
    y = np.arange(files * rows, dtype=np.int64)
    for name, arr in (("x", x), ("y", y)):
        d = os.path.join(str(root), name)
        os.makedirs(d)
        for i in range(files):
            np.save(os.path.join(d, f"{name}_{i:03d}.npy"), arr[i * rows:(i + 1) * rows])
    return {n: os.path.join(str(root), n, f"{n}_*.npy") for n in ("x", "y")}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd here")
@pytest.mark.parametrize("how", ["close", "del"])
@pytest.mark.parametrize("io", ["pread", "auto"])
def test_closed_loader_keeps_only_the_viewed_slot(tmp_path, how, io):
    import glob
    globs = _many_files_dataset(tmp_path)
    ref = {n: np.concatenate([np.load(p) for p in sorted(glob.glob(g))])
           for n, g in globs.items()}
    gc.collect()
    before = _open_fds()
    loader = npyload.Loader(globs, batch_size=5, shuffle=True, seed=3, num_workers=4,
                            prefetch=6, io=io, output="numpy")
    it = iter(loader)
    for _ in range(3):
        next(it)
    b = next(it)
    kept, kept_idx = b["x"], np.array(b.indices)
    during = _open_fds()
    del b, it
    if how == "close":
        loader.close()
    else:
        del loader
    gc.collect()
    after = _open_fds()
    # the loader had files (and maybe io_uring rings) open while it ran ...
    assert during > before
    # ... and only the kept array's slot survives its close: no descriptor
    assert after <= before + 1, (before, during, after)
    np.testing.assert_array_equal(kept, ref["x"][kept_idx])
    del kept
    gc.collect()
    assert _open_fds() <= before + 1
