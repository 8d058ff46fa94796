"""npyload.write never hands back data other than the source's (issue 35):
new data over an old write, splits sharing names, a user's own files, names
taken twice, paths leaving `out`, shorter rewrites, two writers at once, a
full disk, dtypes the loader refuses, an empty generator. Each case is
checked against numpy's reading of the files and a digest of what else is
on disk."""
import errno
import glob
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import file_digests

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")


def arrays(n, seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 3)).astype(np.float32),
            "y": rng.integers(0, 1000, n).astype(np.int64)}


def read_glob(pattern):
    files = sorted(glob.glob(pattern))
    return np.concatenate([np.load(f) for f in files]) if files else None


tree = file_digests


def w(src, out, **kw):
    kw.setdefault("samples_per_file", 4)
    kw.setdefault("progress", False)
    return npyload.write(src, out, **kw)


@pytest.mark.parametrize("kind", ["dict", "iterable"])
def test_new_data_with_the_same_shapes_is_not_adopted(tmp_path, kind):
    """Item 1: the old files were returned as the new data's."""
    a, b = arrays(10, 1), arrays(10, 2)
    src = (lambda d: d) if kind == "dict" else \
        (lambda d: ({k: v[i] for k, v in d.items()} for i in range(10)))
    w(src(a), tmp_path)
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=r"holds other data than file 0 of field 'x'"):
        w(src(b), tmp_path)
    assert tree(tmp_path) == before                      # refused: nothing changed
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/x/train_*.npy"), a["x"])
    f = w(src(b), tmp_path, overwrite=True)
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/x/train_*.npy"), b["x"])
    np.testing.assert_array_equal(np.concatenate([np.load(p) for p in f["y"]]), b["y"])
    # the same data again is a resume: nothing rewritten
    mt = {p: os.stat(p).st_mtime_ns for p in f["x"]}
    w(src(b), tmp_path)
    assert mt == {p: os.stat(p).st_mtime_ns for p in f["x"]}


def test_splits_without_split_in_the_layout_do_not_adopt_each_other(tmp_path):
    """Item 2: val adopted train's files (the fingerprint was per split)."""
    tr, va = arrays(12, 1), arrays(8, 2)
    w(tr, tmp_path, layout="{field}_{id:03d}.npy", split="train")
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=r"belongs to the write of split 'train'"):
        w(va, tmp_path, layout="{field}_{id:03d}.npy", split="val")
    assert tree(tmp_path) == before
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/x_*.npy"), tr["x"])
    # replacing it removes all of train's files, not only those val reuses
    w(va, tmp_path, layout="{field}_{id:03d}.npy", split="val", overwrite=True)
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/x_*.npy"), va["x"])
    # with {split} in the layout, the two live side by side
    w(tr, tmp_path / "s", split="train")
    w(va, tmp_path / "s", split="val")
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/s/x/train_*.npy"), tr["x"])
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/s/x/val_*.npy"), va["x"])


@pytest.mark.parametrize("same_shape", [True, False])
@pytest.mark.parametrize("overwrite", [False, True])
def test_a_users_own_file_is_never_replaced_or_adopted(tmp_path, same_shape, overwrite):
    """Item 3: a file of the user's at a shard's name was replaced (other
    shape) or adopted as the source's data (same shape)."""
    a = arrays(10, 1)
    (tmp_path / "x").mkdir()
    mine = tmp_path / "x" / "train_0001.npy"
    np.save(mine, np.zeros((4, 3) if same_shape else (7, 2), np.float32))
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=r"x/train_0001.npy exists and was not made by "
                                         r"npyload.write"):
        w(a, tmp_path, overwrite=overwrite)
    assert tree(tmp_path) == before
    # packed: the .npy at the name the packer would start from is refused too
    with pytest.raises(ValueError, match=r"x/train_0001.npy exists and was not made"):
        w(a, tmp_path, pack=True, overwrite=overwrite)
    assert tree(tmp_path) == before


def test_names_are_checked_for_every_file_id(tmp_path):
    """Item 4: only file 0's names were compared; '{field}{id}.npy' makes
    field x file 10 and field x1 file 0 the same file."""
    src = {"x": np.zeros((12, 2), np.float32), "x1": np.ones((12, 2), np.float32)}
    with pytest.raises(ValueError, match=r"field 'x1' file 0 and field 'x' file 10 the "
                                         r"same name 'x10.npy'|field 'x' file 10 and field "
                                         r"'x1' file 0 the same name 'x10.npy'"):
        w(src, tmp_path, samples_per_file=1, layout="{field}{id}.npy")
    assert not os.path.exists(tmp_path / "x10.npy")
    it = ({k: v[i] for k, v in src.items()} for i in range(12))
    with pytest.raises(ValueError, match=r"the same name 'x10.npy'"):
        w(it, tmp_path / "it", samples_per_file=1, layout="{field}{id}.npy")


@pytest.mark.parametrize("case", ["split", "field", "empty_field", "absolute", "symlink"])
def test_paths_never_leave_out(tmp_path, case):
    """Item 5: split="../../esc" or a field "../fld" wrote outside out; an
    empty field name wrote at the filesystem root."""
    out = tmp_path / "a" / "b" / "out"
    out.mkdir(parents=True)
    x = np.zeros((3, 2), np.float32)
    kw = {}
    src = {"x": x}
    if case == "split":
        kw["split"] = "../../esc"
    elif case == "field":
        src = {"../fld": x}
    elif case == "empty_field":
        src = {"": x}
        kw["layout"] = "/{field}{id}.npy"
    elif case == "absolute":
        kw["layout"] = str(tmp_path / "abs_{id}.npy")
    else:
        os.symlink(tmp_path, out / "x")
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=r"not a file name inside|outside|non-empty"):
        w(src, out, **kw)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("kind", ["dict", "iterable"])
def test_overwrite_with_fewer_samples_removes_the_old_extra_shards(tmp_path, kind):
    """Item 6: the old write's extra shards stayed, so a glob loaded 10
    samples where 4 were written."""
    a, b = arrays(10, 1), arrays(4, 2)
    mine = tmp_path / "x" / "notes_train_9999.npy"
    w(a, tmp_path, samples_per_file=2)
    np.save(mine, np.arange(3))
    src = b if kind == "dict" else ({k: v[i] for k, v in b.items()} for i in range(4))
    w(src, tmp_path, samples_per_file=2, overwrite=True)
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/x/train_*.npy"), b["x"])
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/y/train_*.npy"), b["y"])
    np.testing.assert_array_equal(np.load(mine), np.arange(3))   # not the writer's


def test_a_shorter_iterable_resuming_an_interrupted_write(tmp_path):
    """An iterable shorter on a rerun, over an interrupted write of the same
    data: the rerun completes with its own samples, the rest goes."""
    a = arrays(16, 1)
    w(a, tmp_path, samples_per_file=4)
    # the journal says "not complete", as after a kill
    jp = tmp_path / ".npyload-write.journal"
    lines = [ln for ln in jp.read_text().splitlines() if '"complete"' not in ln]
    jp.write_text("\n".join(lines) + "\n")
    it = ({k: v[i] for k, v in a.items()} for i in range(8))
    w(it, tmp_path, samples_per_file=4)
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/x/train_*.npy"), a["x"][:8])
    # a completed write of 8 is not "resumed" by a longer or a shorter source
    for n in (12, 4):
        it = ({k: v[i] for k, v in a.items()} for i in range(n))
        with pytest.raises(ValueError, match="completed write of split 'train' of 8"):
            w(it, tmp_path, samples_per_file=4)
    np.testing.assert_array_equal(read_glob(f"{tmp_path}/x/train_*.npy"), a["x"][:8])


HOLDER = textwrap.dedent("""
    import sys, time, numpy as np, npyload
    class Slow:
        def __len__(self): return 40
        def __getitem__(self, i):
            if i == 2:   # inside the write (sample 0 is read before the lock)
                print("started", flush=True)
            time.sleep(0.1)
            return {"x": np.full(3, i, np.float32)}
    npyload.write(Slow(), sys.argv[1], samples_per_file=4, num_workers=1, progress=False)
""")


def test_a_second_writer_fails_at_once_naming_the_first(tmp_path):
    """Item 9: two writers raced; the second failed mid-way with 'changed
    while being packed'."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "started"
        t0 = time.monotonic()
        with pytest.raises(BlockingIOError, match=rf"being written by another writer "
                                                  rf"\(pid {p.pid} on "):
            w({"x": np.zeros((4, 3), np.float32)}, out)
        assert time.monotonic() - t0 < 10   # at once, not after the other finished
        assert p.poll() is None
    finally:
        p.wait(timeout=120)
    assert p.returncode == 0
    got = read_glob(f"{out}/x/train_*.npy")
    np.testing.assert_array_equal(got, np.repeat(np.arange(40, dtype=np.float32), 3)
                                  .reshape(40, 3))


FULL = textwrap.dedent("""
    import resource, signal, sys, numpy as np, npyload
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        npyload.write({"x": np.zeros((64, 1000), np.float32)}, sys.argv[1],
                      samples_per_file=64, progress=False)
    except OSError as e:
        print("errno", e.errno)
""")


def test_a_full_disk_leaves_no_temporary_file(tmp_path):
    """Item 13: a write failing with ENOSPC/EFBIG left its partial
    temporary file, holding the very space that ran out (EFBIG through
    RLIMIT_FSIZE: the same failure path as ENOSPC, no filesystem to fill)."""
    script = tmp_path / "full.py"
    script.write_text(FULL)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                       text=True, timeout=120)
    assert f"errno {errno.EFBIG}" in r.stdout, r.stdout + r.stderr
    left = [f for _, _, fs in os.walk(out) for f in fs if ".tmp-" in f]
    assert left == []
    assert not os.path.exists(out / "x" / "train_0000.npy")


@pytest.mark.parametrize("dtype,why", [
    ("<U3", "unicode"), ("<M8[s]", "datetime64"), ("<m8[s]", "timedelta64"),
    ([("a", "<f4"), ("b", "<i2")], "structured"), ("|S3", "byte string"),
    ("|V4", "void"), ("<f16", "long double")])
def test_dtypes_the_loader_refuses_are_refused_at_sample_0(tmp_path, dtype, why):
    """Item 17: such dtypes were written, and refused only by Loader."""
    src = ({"ok": np.float32(i), "bad": np.zeros(2, dtype)} for i in range(5))
    with pytest.raises(TypeError, match=rf"sample 0, field 'bad': .*{why}"):
        w(src, tmp_path / "o")
    assert not os.path.exists(tmp_path / "o")


def test_dtypes_the_loader_reads_are_accepted(tmp_path):
    for dt in ("<c8", ">f8", "<f2", "|b1", "<u8"):
        f = w({"v": np.ones((3, 2), dt)}, tmp_path / dt.strip("<>|"))
        assert np.load(f["v"][0]).dtype == np.dtype(dt)


def test_an_empty_generator_is_a_value_error(tmp_path):
    """Item 20 (first half): an empty generator gave a bare StopIteration."""
    with pytest.raises(ValueError, match="the source has no samples"):
        w((s for s in []), tmp_path)
    with pytest.raises(ValueError, match="the source has no samples"):
        w([], tmp_path)
