"""num_workers='auto' / prefetch='auto' (issue 37): the controller inside
the loader. The truth is numpy's reading of the same files and the order
of a fixed configuration; the controller is forced (the library's
AUTO_FORCE option) to change workers and slots every two batches."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import npyload
from npyload import _npyload


@pytest.fixture()
def files(tmp_path):
    x = np.arange(600 * 12, dtype=np.float32).reshape(600, 12)
    y = (np.arange(600) % 251).astype(np.uint8)
    for i in range(6):
        np.save(tmp_path / f"x_{i:04d}.npy", x[i * 100:(i + 1) * 100])
        np.save(tmp_path / f"y_{i:04d}.npy", y[i * 100:(i + 1) * 100])
    return {"x": str(tmp_path / "x_*.npy"), "y": str(tmp_path / "y_*.npy")}, x, y


def _forced(loader: npyload.Loader, every: int) -> None:
    # The library's testing option: a new pseudo-random (workers, slots)
    # pair every `every` batches instead of measuring.
    loader._opts[_npyload.OPT_AUTO_FORCE] = every
    loader._opts[_npyload.OPT_AUTO_CORES] = 4
    loader._c.close()
    loader._c = loader._check_start()


def test_auto_is_the_default(files):
    fields, _, _ = files
    ld = npyload.Loader(fields, batch_size=32)
    assert ld.num_workers == "auto" and ld.prefetch == "auto"
    assert ld.auto_history() == []
    next(iter(ld))
    st = ld.stats()
    assert st["auto_mode"] == 3 and st["memory_budget"] > 0
    assert 0 < st["memory_bytes"] <= st["memory_budget"]
    assert ld.auto_history()[0]["reason"] == "start"
    ld.close()


def test_forced_changes_deliver_numpys_rows_in_the_fixed_order(files, caplog):
    fields, x, y = files
    fixed = npyload.Loader(fields, batch_size=32, shuffle=True, seed=3, num_workers=1,
                           prefetch=1)
    auto = npyload.Loader(fields, batch_size=32, shuffle=True, seed=3)
    _forced(auto, 2)
    workers, slots = set(), set()
    with caplog.at_level(logging.INFO, logger="npyload"):
        for epoch in range(3):
            fixed.set_epoch(epoch)
            auto.set_epoch(epoch)
            n = 0
            for a, f in zip(auto, fixed, strict=True):
                idx = np.asarray(a.indices)
                assert np.array_equal(idx, np.asarray(f.indices))
                assert np.array_equal(np.asarray(a["x"]), x[idx])
                assert np.array_equal(np.asarray(a["y"]), y[idx])
                st = auto.stats()
                workers.add(st["num_workers"])
                slots.add(st["num_slots"])
                n += len(idx)
            assert n == 600
    assert len(workers) >= 3 and len(slots) >= 3, (workers, slots)
    hist = auto.auto_history()
    assert len(hist) >= 10 and any(h["reason"] == "forced" for h in hist)
    lines = [r.getMessage() for r in caplog.records if r.name == "npyload"]
    assert lines and all(l.startswith("npyload auto: workers ") for l in lines)
    assert any("(forced)" in l for l in lines)
    auto.close()
    fixed.close()


def test_explicit_counts_have_no_controller(files):
    fields, _, _ = files
    ld = npyload.Loader(fields, batch_size=32, num_workers=1, prefetch=2)
    for _ in ld:
        pass
    st = ld.stats()
    assert st["auto_mode"] == 0 and st["num_workers"] == 1 and st["num_slots"] == 3
    assert ld.auto_history() == []
    ld.close()


def test_memory_budget_too_small_names_the_option(files):
    fields, _, _ = files
    with pytest.raises(Exception, match="MEMORY_BUDGET"):
        ld = npyload.Loader(fields, batch_size=32, memory_budget=1000)
        next(iter(ld))
    with pytest.raises(ValueError, match="auto_target"):
        npyload.Loader(fields, batch_size=32, auto_target=0)


def test_many_workers_on_few_cores_warns_once_naming_auto(files):
    # A fresh process: the warning is once per process.
    fields, _, _ = files
    cores = len(os.sched_getaffinity(0))
    code = textwrap.dedent(f"""
        import warnings, npyload
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(2):
                ld = npyload.Loader({fields!r}, batch_size=8, num_workers={cores + 26})
                assert ld.num_workers == {cores + 26}
                ld.close()
        msgs = [str(m.message) for m in w]
        assert len(msgs) == 1, msgs
        assert "'auto'" in msgs[0] and "{cores + 26}" in msgs[0], msgs
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_local_world_size_divides_the_cores(monkeypatch):
    from npyload import _options
    monkeypatch.setattr(_options, "_process_cores", lambda: 8)
    monkeypatch.setattr(_options._os, "cpu_count", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _options._auto_cores() == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert _options._auto_cores() == 1
    # A rank whose affinity is already its own share keeps it.
    monkeypatch.setattr(_options, "_process_cores", lambda: 3)
    assert _options._auto_cores() == 3


@pytest.mark.parametrize("force", [0, 2], ids=["measured", "forced"])
def test_a_mixture_under_the_controller_delivers_the_fixed_order(tmp_path, force):
    """Loader(sources=...) with num_workers and prefetch 'auto', two epochs
    (other weights for the second, and a change after its third batch,
    with batches read ahead), against num_workers=2, prefetch=3 (no
    controller) over the same sources:
    the same (source, index) rows in the same order, the bytes the files
    hold and the same running digest. Forced, the controller changes
    workers and slots every two batches."""
    from test_mix_loader import TAG, make_sources
    sources, _ = make_sources(tmp_path, [90, 230])
    kw = dict(sources=sources, weights={"src0": 1, "src1": 3}, batch_size=16,
              shuffle=True, seed=11)
    fixed = npyload.Loader(num_workers=2, prefetch=3, **kw)  # no controller
    auto = npyload.Loader(**kw)
    assert auto.num_workers == "auto" and auto.prefetch == "auto"
    if force:
        _forced(auto, force)
    counts = set()

    def epoch_rows(loader, epoch):
        if epoch:
            loader.set_weights({"src0": 2, "src1": 1})
        loader.set_epoch(epoch)
        out = []
        for n, b in enumerate(loader, 1):
            src, idx = np.asarray(b.source), np.asarray(b.indices)
            assert np.array_equal(np.asarray(b["x"]), src * TAG + idx)
            assert np.array_equal(np.asarray(b["y"])[:, 1, 2], -(src * TAG + idx))
            out.extend(zip(src.tolist(), idx.tolist()))
            if epoch and n == 3:
                loader.set_weights({"src0": 1, "src1": 1})
            if loader is auto:
                st = auto.stats()
                counts.add((st["num_workers"], st["num_slots"]))
        return out

    for epoch in range(2):
        want, got = epoch_rows(fixed, epoch), epoch_rows(auto, epoch)
        assert got == want, f"epoch {epoch}: the auto loader's rows differ"
        assert len(want) == 320 and {s for s, _ in want} == {0, 1}
    a, f = auto.stats(), fixed.stats()
    assert (a["digest"], a["digest_rows"]) == (f["digest"], f["digest_rows"])
    assert a["source_samples"] == f["source_samples"]
    assert a["auto_mode"] == 3 and f["auto_mode"] == 0
    if force:
        assert len(counts) >= 3, counts
        assert any(h["reason"] == "forced" for h in auto.auto_history())
    auto.close()
    fixed.close()


def _two_cores(loader: npyload.Loader) -> None:
    # Two cores whatever the machine: the controller starts at two workers.
    loader._opts[_npyload.OPT_AUTO_CORES] = 2
    loader._c.close()
    loader._c = loader._check_start()


def test_read_ahead_workers_start_with_two_slots_each(files):
    """Issue 37: workers that read ahead (a host transform here) fill two
    slots each; the controller starts with both workers' and the held one
    (4 at most: the library's default slots), not with one each (3), which
    left a worker unable to read ahead while the loop had not taken the
    batch before. A loader without read-ahead still starts at 3. Every
    event carries the workers' wait for a free slot, and stats() the
    counter it comes from."""
    fields, x, _ = files
    tf = {"x": npyload.Transform(dtype="float16")}
    for transforms, want in ((tf, 4), (None, 3)):
        ld = npyload.Loader(fields, batch_size=32, transforms=transforms)
        _two_cores(ld)
        it = iter(ld)
        b = next(it)
        if transforms:
            idx = np.asarray(b.indices)
            assert np.array_equal(np.asarray(b["x"]), x[idx].astype(np.float16))
        start = ld.auto_history()[0]
        assert start["reason"] == "start" and start["workers"] == 2
        assert start["slots"] == want, (transforms is not None, start)
        assert "slot_wait" in start
        for _ in it:
            pass
        st = ld.stats()
        assert 0 <= st["slot_wait_ns"] <= st["num_workers"] * st["elapsed_ns"] + 1
        ld.close()


def test_forced_read_ahead_switching_keeps_bytes_and_order(files):
    """Issue 37 item 5: the controller switching read-ahead off and on
    every few batches (AUTO_FORCE flips it with the counts) delivers
    numpy's bytes in the order of a fixed loader with read-ahead, for
    host transforms (read-ahead on at start) over three epochs; stats()
    and the history say the state."""
    fields, x, y = files
    tf = {"x": npyload.Transform(dtype="float16", scale=0.5)}
    fixed = npyload.Loader(fields, batch_size=16, shuffle=True, seed=3, num_workers=2,
                           prefetch=6, transforms=tf)
    auto = npyload.Loader(fields, batch_size=16, shuffle=True, seed=3, transforms=tf)
    _forced(auto, 2)
    states = set()
    for epoch in range(3):
        want, got = [], []
        for ld, out in ((fixed, want), (auto, got)):
            ld.set_epoch(epoch)
            for b in ld:
                idx = np.asarray(b.indices)
                xb, yb = np.asarray(b["x"]), np.asarray(b["y"])
                assert np.array_equal(xb, (x[idx] * 0.5).astype(np.float16))
                assert np.array_equal(yb, y[idx])
                out.append(idx.tolist())
                if ld is auto:
                    states.add(ld.stats()["read_ahead_on"])
        assert got == want, f"epoch {epoch}: the order differs"
    hist = auto.auto_history()
    assert hist[0]["read_ahead"] is True
    assert any(h["read_ahead"] != h["prev_read_ahead"] for h in hist), hist
    assert states == {0, 1}, states
    assert fixed.stats()["read_ahead_on"] == 1
    auto.close()
    fixed.close()


def test_read_ahead_goes_off_in_the_page_cache(files):
    """Issue 37 item 5, the rule on a real loader: host transforms read
    from the page cache (the files were just written) never block in
    their reads, so the controller switches read-ahead off (reason
    "read-ahead-off", in the history and the INFO log) and the batches
    stay numpy's. The consumer sleeps 5 ms a batch so that windows
    close. Plain rows (no read-ahead at start) and an explicit
    read_ahead=False never switch, and report read-ahead off."""
    fields, x, _ = files
    tf = {"x": npyload.Transform(dtype="float16")}
    ld = npyload.Loader(fields, batch_size=8, shuffle=True, seed=1, transforms=tf)
    _two_cores(ld)
    off = None
    for epoch in range(4):
        ld.set_epoch(epoch)
        for b in ld:
            idx = np.asarray(b.indices)
            assert np.array_equal(np.asarray(b["x"]), x[idx].astype(np.float16))
            time.sleep(0.005)
        off = next((h for h in ld.auto_history() if h["reason"] == "read-ahead-off"), None)
        if off is not None:
            break
    assert off is not None, ld.auto_history()
    assert off["prev_read_ahead"] is True and off["read_ahead"] is False
    assert off["read_blocked"] < 0.01
    ld.close()
    for kw in ({}, {"transforms": tf, "read_ahead": False}):
        other = npyload.Loader(fields, batch_size=8, **kw)
        for _ in other:
            pass
        assert other.stats()["read_ahead_on"] == 0
        assert all(not h["read_ahead"] for h in other.auto_history())
        other.close()
