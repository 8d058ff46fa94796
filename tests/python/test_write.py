"""npyload.write: any source of samples -> NPY shards npyload.Loader reads.
Round trips against numpy's own reading and np.save's bytes, every source
kind, layouts, a short last file, mismatches refused by index, resume after
SIGKILL at random points giving the bytes of an uninterrupted run, pack and
narrow."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import file_digests

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

DTYPES = ["<f4", "<f8", "<i2", "|u1", "<i8", "|b1", "<f2", ">i4"]


def make_arrays(n=23, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "img": rng.integers(0, 256, size=(n, 2, 5, 3)).astype(np.uint8),
        "val": rng.standard_normal((n, 4)).astype(np.float32),
        "lab": np.arange(n, dtype=np.int64),
    }


def loaded(fields, n):
    """Every sample as npyload.Loader delivers it, in index order."""
    L = npyload.Loader(fields, batch_size=4, shuffle=True, seed=1, num_workers=2,
                       output="numpy")
    out = {k: [None] * n for k in fields}
    for b in L:
        for r, i in enumerate(b.indices):
            for k in fields:
                out[k][int(i)] = np.array(b[k][r], copy=True)
    L.close()
    return {k: np.stack(v) for k, v in out.items()}


digest = file_digests   # sha256 of every file but the writer's journal and lock


@pytest.mark.parametrize("spf", [1, 5, 23, 64])
def test_dict_source_round_trip_and_np_save_bytes(tmp_path, spf):
    a = make_arrays()
    fields = npyload.write(a, tmp_path, samples_per_file=spf, progress=False)
    assert set(fields) == set(a)
    nfiles = -(-23 // spf)
    for k, arr in a.items():
        assert len(fields[k]) == nfiles
        parts = [np.load(p) for p in fields[k]]
        assert [len(p) for p in parts][-1] == 23 - spf * (nfiles - 1)  # the short last file
        np.testing.assert_array_equal(np.concatenate(parts), arr)
        # byte for byte what np.save writes for the same rows
        for j, p in enumerate(fields[k]):
            ref = tmp_path / "ref.npy"
            np.save(ref, arr[j * spf:(j + 1) * spf])
            assert open(p, "rb").read() == ref.read_bytes()
    got = loaded(fields, 23)
    for k in a:
        np.testing.assert_array_equal(got[k], a[k])


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(tmp_path, dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((11, 3)) * 50).astype(dtype)
    fields = npyload.write({"x": x}, tmp_path, samples_per_file=4, progress=False)
    np.testing.assert_array_equal(np.concatenate([np.load(p) for p in fields["x"]]), x)
    assert np.load(fields["x"][0]).dtype == x.dtype
    np.testing.assert_array_equal(loaded(fields, 11)["x"], x)


class DS:
    """A map-style Dataset of dicts (numpy values; torch tensors below)."""

    def __init__(self, a, to=None):
        self.a, self.to = a, to

    def __len__(self):
        return len(next(iter(self.a.values())))

    def __getitem__(self, i):
        return {k: (self.to(v[i]) if self.to else v[i]) for k, v in self.a.items()}


def test_dataset_and_iterable_sources_give_the_same_bytes(tmp_path):
    a = make_arrays()
    f1 = npyload.write(a, tmp_path / "dict", samples_per_file=6, progress=False)
    f2 = npyload.write(DS(a), tmp_path / "ds", samples_per_file=6, num_workers=3,
                       progress=False)
    f3 = npyload.write((DS(a)[i] for i in range(23)), tmp_path / "it", samples_per_file=6,
                       progress=False)
    for k in a:
        for p1, p2, p3 in zip(f1[k], f2[k], f3[k]):
            b = open(p1, "rb").read()
            assert open(p2, "rb").read() == b and open(p3, "rb").read() == b


def test_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    a = make_arrays()
    f = npyload.write(DS(a, lambda v: torch.as_tensor(np.asarray(v))), tmp_path,
                      samples_per_file=7, progress=False)
    np.testing.assert_array_equal(loaded(f, 23)["val"], a["val"])


def test_reference_layout(tmp_path):
    a = {"images": np.zeros((5, 2, 8, 16), np.float32) + np.arange(5)[:, None, None, None],
         "heatmaps": np.ones((5, 2, 4, 8), np.float32)}
    layout = {"images": "images/{split}/{split}_{id:04d}.npy",
              "heatmaps": "labels/{split}/{split}_{id:04d}_heatmaps.npy"}
    f = npyload.write(a, tmp_path, samples_per_file=2, layout=layout, split="val",
                      progress=False)
    assert f["images"] == [str(tmp_path / f"images/val/val_{i:04d}.npy") for i in range(3)]
    assert f["heatmaps"][2] == str(tmp_path / "labels/val/val_0002_heatmaps.npy")
    np.testing.assert_array_equal(loaded(f, 5)["images"], a["images"])


def test_mismatched_sample_is_named(tmp_path):
    a = make_arrays()
    samples = [DS(a)[i] for i in range(23)]
    samples[9] = dict(samples[9], val=np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"sample 9, field 'val': <f4 \(5,\), sample 0 "
                                         r"had <f4 \(4,\)"):
        npyload.write(samples, tmp_path, samples_per_file=4, progress=False)
    samples[9] = dict(samples[9], val=np.zeros(4, np.float64))
    with pytest.raises(ValueError, match=r"sample 9, field 'val': <f8"):
        npyload.write(iter(samples), tmp_path / "b", samples_per_file=4, progress=False)
    with pytest.raises(ValueError, match="different lengths"):
        npyload.write({"a": np.zeros(3), "b": np.zeros(4)}, tmp_path / "c")


def test_a_different_call_is_refused_then_overwritten(tmp_path):
    a = make_arrays()
    npyload.write(a, tmp_path, samples_per_file=5, progress=False)
    with pytest.raises(ValueError, match="different write"):
        npyload.write(a, tmp_path, samples_per_file=6, progress=False)
    f = npyload.write(a, tmp_path, samples_per_file=6, overwrite=True, progress=False)
    assert len(f["img"]) == 4


@pytest.mark.parametrize("narrow", [False, True])
def test_pack_and_narrow(tmp_path, narrow):
    a = make_arrays()
    a["gray"] = (np.arange(23 * 6) % 256 / 255).astype(np.float32).reshape(23, 6)
    a["noise"] = np.random.default_rng(5).standard_normal((23, 64)).astype(np.float32)
    f = npyload.write(a, tmp_path, samples_per_file=5, pack=not narrow, narrow=narrow,
                      progress=False)
    assert all(p.endswith(".npy.zst") for v in f.values() for p in v)
    assert not any(n.endswith(".npy") for _, _, fs in os.walk(tmp_path) for n in fs)
    got = loaded(f, 23)
    for k in a:
        assert got[k].tobytes() == a[k].tobytes(), k
    if narrow:  # 8-bit gray levels narrow, normal floats (val) do not and stay plain
        # 5 samples x 6 gray levels: 30 distinct values; 5 x 64 normal floats:
        # 320, more than a table holds, so that field stays plain
        assert npyload.inspect(f["gray"][0])["narrow_values"] == 30
        assert "narrow_values" not in npyload.inspect(f["noise"][0])


CHILD = textwrap.dedent("""
    import sys, time, numpy as np, npyload
    class Slow:
        def __len__(self): return 90
        def __getitem__(self, i):
            time.sleep(0.004)
            rng = np.random.default_rng(i)
            return {"x": rng.standard_normal((3, 7)).astype(np.float32),
                    "y": np.int64(i * 3)}
    pack = sys.argv[2] == "1"
    npyload.write(Slow(), sys.argv[1], samples_per_file=8, num_workers=2, pack=pack,
                  progress=False)
""")


@pytest.mark.parametrize("pack", [False, True])
def test_killed_at_random_points_resumes_to_identical_bytes(tmp_path, pack):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, str(script), str(ref), str(int(pack))], check=True,
                   timeout=120)
    want = digest(ref)
    rnd = random.Random(7)
    for trial in range(3):
        out = tmp_path / f"run{trial}"
        for _ in range(3):  # killed up to three times, at random moments
            p = subprocess.Popen([sys.executable, str(script), str(out), str(int(pack))])
            time.sleep(rnd.uniform(0.05, 0.6))
            p.send_signal(signal.SIGKILL)
            p.wait()
        subprocess.run([sys.executable, str(script), str(out), str(int(pack))], check=True,
                       timeout=120)
        assert digest(out) == want, trial


def test_a_journal_copy_left_by_a_kill_is_removed(tmp_path):
    # A writer killed while it compacts the journal (write_atomic: written,
    # fsynced, renamed) leaves ..npyload-write.journal.tmp-PID-TID behind;
    # the next writer must not leave it in the output (found by the random
    # kills above, which hit that moment now and then).
    a = make_arrays()
    npyload.write(a, tmp_path, samples_per_file=8, progress=False)
    left = tmp_path / "..npyload-write.journal.tmp-999999-1"
    left.write_bytes(b'{"op": "spec"')
    want = digest(tmp_path)
    del want[left.name]
    npyload.write(a, tmp_path, samples_per_file=8, progress=False)
    assert not left.exists()
    assert digest(tmp_path) == want
