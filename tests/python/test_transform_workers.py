"""Loader(transform=fn, transform_workers=N): the hook on N threads (issue
24, item 3). Results in order whatever the threads' speeds, at most
``prefetch`` batches taken ahead of the loop, ``batch.rng`` a pure function
of (seed, epoch, rank, seq) by the documented formula, errors and ``break``
as with one thread, hook_ns the summed time in fn.

No timed assertions: fn sleeps random amounts only to shuffle the order in
which the threads finish; concurrency is shown with a barrier (whose
generous timeout only turns a hang into a failure). Independent truths:
numpy's reading of the files, the plain loader's order, and numpy's
SeedSequence / PCG64 written out here from the docstring's formula.
"""
import gc
import random
import threading
import time

import numpy as np
import pytest

import npyload
from conftest import N, to_numpy

# The helpers and the autouse check that no hook thread outlives its test.
from test_transform_hook import HANG, hook_threads, make, no_thread_left  # noqa: F401


def documented_rng(seed, epoch, seq, rank=0):
    """The seeding the Loader docstring and README state, written out."""
    words = np.array([seed % 2**64, epoch, rank, seq], dtype="<u8").view("<u4")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def jitter(seq, epoch):
    """A sleep of 0 .. 4 ms, different per batch (so later batches often
    finish first on other threads)."""
    time.sleep(random.Random(seq * 1000 + epoch).random() * 0.004)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_results_in_order_equal_the_sequential_result(dataset, workers):
    globs, ref = dataset
    kw = dict(shuffle=True, seed=11, output="numpy")

    def fn(b):
        jitter(b.seq, b.epoch)
        idx = to_numpy(b.indices)
        return b.seq, idx.tolist(), np.asarray(b["images"]) * 2 + 1, np.asarray(b["labels"]).sum()

    L = make(globs, transform=fn, transform_workers=workers, prefetch=workers + 1, **kw)
    for epoch in (0, 1):
        L.set_epoch(epoch)
        got = list(L)
        plain = make(globs, **kw)
        plain.set_epoch(epoch)
        order = [to_numpy(b.indices).tolist() for b in plain]
        assert [g[0] for g in got] == list(range(len(order)))
        assert [g[1] for g in got] == order
        for seq, idx, images, labels in got:
            np.testing.assert_array_equal(images, ref["images"][idx] * 2 + 1)
            assert labels == ref["labels"][idx].sum()


@pytest.mark.parametrize("prefetch", [2, 3])
def test_never_more_than_prefetch_batches_ahead(dataset, prefetch):
    """fn counts the batches it started that the loop has not received yet
    (the loop body sleeps so the threads run ahead as far as allowed); the
    high-water mark stays at prefetch with 4 threads. The first `prefetch`
    batches meet at a barrier: they are in fn at the same time (it would
    time out, failing, if the threads ran one batch at a time)."""
    globs, _ = dataset
    lock = threading.Lock()
    ahead = [0, 0]  # now, high-water mark
    meet = threading.Barrier(prefetch, timeout=HANG)

    def fn(b):
        with lock:
            ahead[0] += 1
            ahead[1] = max(ahead)
        if b.seq < prefetch:
            meet.wait()
        jitter(b.seq, 0)
        return b.seq

    L = make(globs, transform=fn, transform_workers=4, prefetch=prefetch, batch_size=2)
    got = []
    for seq in L:
        with lock:
            ahead[0] -= 1
        got.append(seq)
        time.sleep(0.002)
    assert got == list(range(len(L)))
    assert ahead[1] == prefetch, f"high-water mark {ahead[1]}, prefetch {prefetch}"
    assert L.num_slots == prefetch + 2  # as with one thread


def rng_fn(b):
    jitter(b.seq, b.epoch)
    assert isinstance(b.rng, np.random.Generator)
    return b.epoch, b.seq, b.rng.integers(0, 2**62, size=4).tolist(), b.rng.random()


@pytest.mark.parametrize("as_tuple", [False, True])
def test_rng_is_the_documented_function_of_seed_epoch_seq(dataset, as_tuple):
    globs, _ = dataset
    seed = -7  # an int64 seed: taken mod 2**64
    runs = {}
    for workers in (1, 2, 4):
        L = make(globs, transform=rng_fn, transform_workers=workers, shuffle=True, seed=seed,
                 as_tuple=as_tuple)
        L.set_epoch(3)
        runs[workers] = list(L)
    assert runs[1] == runs[2] == runs[4]
    for epoch, seq, ints, x in runs[1]:
        g = documented_rng(seed, epoch, seq)
        assert (ints, x) == (g.integers(0, 2**62, size=4).tolist(), g.random())
    # Different seq, epoch or seed: different draws.
    assert len({tuple(r[2]) for r in runs[1]}) == len(runs[1])
    other_epoch = make(globs, transform=rng_fn, shuffle=True, seed=seed)
    other_epoch.set_epoch(4)
    other_seed = make(globs, transform=rng_fn, shuffle=True, seed=seed + 1)
    other_seed.set_epoch(3)
    for other in (other_epoch, other_seed):
        assert all(a[2] != b[2] for a, b in zip(runs[1], list(other)))


def test_rng_is_exact_on_resume_mid_epoch(dataset):
    globs, _ = dataset
    kw = dict(shuffle=True, seed=5)
    full = make(globs, transform=rng_fn, transform_workers=2, **kw)
    full.set_epoch(2)
    it = iter(full)
    head = [next(it) for _ in range(3)]
    saved = full.state_dict()
    rest = list(it)
    for workers in (1, 4):
        R = make(globs, transform=rng_fn, transform_workers=workers, num_workers=1, **kw)
        R.load_state_dict(saved)
        assert list(R) == rest, f"transform_workers={workers}"
    assert [r[1] for r in head + rest] == list(range(len(full)))


def test_rng_differs_between_ranks(dataset):
    """Ranks of one job see different draws for the same seq (their batches
    hold different samples; equal draws would correlate the augmentation)."""
    globs, _ = dataset
    per_rank = []
    for rank in (0, 1):
        L = make(globs, transform=rng_fn, rank=rank, world_size=2, seed=1)
        per_rank.append(list(L))
        for epoch, seq, ints, _ in per_rank[-1]:
            assert ints == documented_rng(1, epoch, seq, rank).integers(0, 2**62, size=4).tolist()
    assert all(a[1] == b[1] and a[2] != b[2] for a, b in zip(*per_rank))


def test_exception_under_four_threads_arrives_in_order(dataset):
    globs, _ = dataset

    def fn(b):
        jitter(b.seq, b.epoch)
        if b.seq == 5:
            raise ValueError("bad crop")
        return b.seq

    L = make(globs, transform=fn, transform_workers=4, batch_size=2, shuffle=True)
    L.set_epoch(1)
    got = []
    with pytest.raises(npyload.TransformError, match=r"seq=5 of epoch 1.*bad crop") as ei:
        for seq in L:
            got.append(seq)
    assert got == [0, 1, 2, 3, 4]
    assert (ei.value.seq, ei.value.epoch) == (5, 1)
    assert isinstance(ei.value.__cause__, ValueError)
    del ei
    gc.collect()
    assert hook_threads() == []
    assert L.state_dict()["consumed"] == 5 * 2  # resuming retries batch 5


def test_break_stops_the_threads_and_the_next_loop_works(dataset):
    globs, _ = dataset

    def fn(b):
        jitter(b.seq, b.epoch)
        return to_numpy(b.indices).tolist()

    # prefetch=1: 3 slots; a batch leaked by a stopped thread would make a
    # later loop fail ("every slot is held").
    L = make(globs, transform=fn, transform_workers=4, prefetch=1, num_workers=1)
    for i, _ in enumerate(L):
        if i == 2:
            break
    gc.collect()
    assert hook_threads() == []
    assert L.state_dict()["consumed"] == 3 * 4
    for _ in range(3):
        assert sum(list(L), []) == list(range(N))


def test_hook_ns_is_the_summed_time_in_fn(dataset):
    globs, _ = dataset
    lock = threading.Lock()
    inside = [0]

    def fn(b):
        t0 = time.perf_counter_ns()
        time.sleep(0.002)
        with lock:
            inside[0] += time.perf_counter_ns() - t0
        return b.seq

    L = make(globs, transform=fn, transform_workers=4, prefetch=4)
    before = L.stats()["hook_ns"]
    assert list(L) == list(range(len(L)))
    st = L.stats()
    assert before == 0
    assert st["hook_ns"] >= inside[0] >= len(L) * 2_000_000
    # The verdict judges the time per thread (see _LoopClock).
    assert L._clock.verdict_hook_ns() == st["hook_ns"] // 4
    assert st["transform_workers"] == 4


def test_stats_name_the_hook_threads(dataset):
    globs, _ = dataset
    hooked = make(globs, transform=lambda b: b, transform_workers=3)
    plain = make(globs)
    # Before the first iter() (nothing started) and after an epoch.
    assert hooked.stats()["transform_workers"] == 3
    assert plain.stats()["transform_workers"] == 0
    for L in (hooked, plain):
        for _ in L:
            pass
    assert hooked.stats()["transform_workers"] == 3
    assert plain.stats()["transform_workers"] == 0


def test_default_prefetch_covers_the_threads(dataset):
    globs, _ = dataset
    one = make(globs, transform=lambda b: b, num_workers=1)
    many = make(globs, transform=lambda b: b, num_workers=1, transform_workers=6)
    assert many.transform_workers == 6 and one.transform_workers == 1
    # prefetch 'auto' (the default): the controller sizes the library's
    # slots; the hook's queue covers the threads.
    assert many.prefetch == one.prefetch == "auto"
    assert many._hook_prefetch == max(one._hook_prefetch, 7)
    fixed = make(globs, transform=lambda b: b, num_workers=1, transform_workers=6, prefetch=3)
    assert fixed.prefetch == 3  # a number is what it says
    assert make(globs, transform=lambda b: b, transform_workers=6, prefetch=2).prefetch == 2


@pytest.mark.parametrize("value, err, match", [
    (0, ValueError, r"transform_workers = 0 out of range: 1 \.\. 256"),
    (-2, ValueError, r"transform_workers = -2 out of range"),
    (257, ValueError, r"transform_workers = 257 out of range"),
    (2.0, TypeError, r"transform_workers must be an int"),
    (True, TypeError, r"transform_workers must be an int"),
    ("2", TypeError, r"transform_workers must be an int"),
    (None, TypeError, r"transform_workers must be an int"),
])
def test_transform_workers_is_checked(dataset, value, err, match):
    globs, _ = dataset
    with pytest.raises(err, match=match):
        make(globs, transform=lambda b: b, transform_workers=value)


def test_transform_workers_needs_a_transform(dataset):
    globs, _ = dataset
    with pytest.raises(ValueError, match=r"transform_workers = 2 needs transform="):
        make(globs, transform_workers=2)
    plain = make(globs, transform_workers=1)  # the default, accepted
    assert plain.transform_workers == 1 and sum(1 for _ in plain) == len(plain)


def test_fn_sees_every_batch_member_and_augment(dataset):
    """The Batch fn receives carries rng on top of everything the loader's
    Batch holds (the augmentation decisions included), the same as the
    plain loader's batches."""
    globs, _ = dataset
    kw = dict(shuffle=True, seed=4, output="numpy",
              transforms={"images": npyload.Transform(hflip=0.5)})

    def fn(b):
        assert isinstance(b, npyload.Batch) and repr(b).startswith("<npyload.Batch")
        return (b.seq, b.epoch, b.num_samples, to_numpy(b.indices).tolist(),
                {k: [a.tolist() for a in v] for k, v in b.augment.items()},
                np.asarray(b["images"]).copy())

    got = list(make(globs, transform=fn, transform_workers=3, **kw))
    want = [fn(b) for b in make(globs, **kw)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:5] == w[:5] and "images" in g[4]
        np.testing.assert_array_equal(g[5], w[5])


# ---- Ctrl-C while iter() starts the threads (issue 35, item 12) ----

def _settled(check, timeout=HANG):
    """Polls check() until it holds (a thread that has finished its work
    may take a moment to end); the timeout only turns a hang into a failure."""
    t0 = time.monotonic()
    while not check() and time.monotonic() - t0 < timeout:
        time.sleep(0.01)
    return check()


@pytest.mark.parametrize("at", [("before", 1), ("after", 1), ("after", 2), ("before", 3)])
def test_ctrl_c_while_iter_starts_the_threads_leaves_none(dataset, monkeypatch, at):
    """KeyboardInterrupt raised while iter() starts the transform= threads
    (Thread.start waits for each thread, so Ctrl-C lands there): before or
    after the k-th thread has begun. Afterwards no hook thread runs on, no
    slot stays held (prefetch=1: a held slot fails the next epoch with
    "every slot is held"), set_epoch is not refused "in use", and the next
    loops deliver whole epochs in the plain loader's order."""
    globs, _ = dataset
    when, k = at
    real = threading.Thread.start
    started = []

    def start(self):
        if self.name != "npyload-transform":
            return real(self)
        started.append(self)
        if when == "before" and len(started) == k:
            raise KeyboardInterrupt
        real(self)
        if when == "after" and len(started) == k:
            raise KeyboardInterrupt

    kw = dict(shuffle=True, seed=5, output="numpy", prefetch=1, num_workers=1)
    L = make(globs, transform=lambda b: to_numpy(b.indices).tolist(), transform_workers=3,
             **kw)
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        iter(L)
    monkeypatch.setattr(threading.Thread, "start", real)
    assert _settled(lambda: hook_threads() == []), "a transform thread outlived Ctrl-C"
    L.set_epoch(0)  # not "in use"
    plain = [to_numpy(b.indices).tolist() for b in make(globs, **kw)]
    for _ in range(2):
        L.set_epoch(0)
        assert list(L) == plain
    L.close()


def test_ctrl_c_as_a_wait_takes_its_lock_back_is_a_keyboard_interrupt(dataset):
    """Ctrl-C landing in CPython's Condition.wait just before it takes its
    lock back (next() waits for the transform threads) makes the `with`
    release an unlocked lock: RuntimeError, the KeyboardInterrupt as its
    context (CI met it at random). The user pressed Ctrl-C: next() raises
    KeyboardInterrupt, the threads stop with the iterator, and the loader
    delivers a whole epoch afterwards."""
    globs, _ = dataset
    go = threading.Event()

    def fn(b):
        go.wait(HANG)
        return b.seq

    L = make(globs, transform=fn, transform_workers=2, prefetch=1, num_workers=1,
             output="numpy")
    it = iter(L)
    cv = L._pipe._cv
    real = cv._acquire_restore
    fired = []

    def acquire_restore(x):
        if threading.current_thread() is threading.main_thread() and not fired:
            fired.append(1)
            raise KeyboardInterrupt  # before the lock is taken back
        return real(x)

    cv._acquire_restore = acquire_restore
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)
    finally:
        go.set()
    assert fired
    del it
    gc.collect()
    assert _settled(lambda: hook_threads() == []), "a transform thread outlived Ctrl-C"
    L.set_epoch(1)
    assert list(L) == list(range(len(L)))
    L.close()


def test_ctrl_c_at_random_moments_of_iter_and_next(dataset):
    """A real signal handler raising KeyboardInterrupt at random moments of
    iter() and the first next() over 30 loaders: whatever it interrupts, once
    the iterator is dropped no hook thread runs, set_epoch works and the
    loader still delivers a whole epoch."""
    import signal
    globs, _ = dataset
    armed = [False]

    def on_alarm(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, on_alarm)
    rng = random.Random(35)
    try:
        for i in range(30):
            L = make(globs, transform=lambda b: b.seq, transform_workers=1 + i % 4,
                     prefetch=1, num_workers=1, output="numpy")
            it = None
            armed[0] = True
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, 0.003))
            try:
                it = iter(L)
                next(it)
                time.sleep(0.01)
            except KeyboardInterrupt:
                pass
            finally:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            del it
            gc.collect()
            L.set_epoch(1)
            assert _settled(lambda: hook_threads() == []), i
            assert list(L) == list(range(len(L)))
            L.close()
    finally:
        signal.signal(signal.SIGALRM, old)
