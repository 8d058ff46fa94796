"""One loader, several threads (issue 21, item 1).

The rule under test: calls on one npyload.Loader never overlap. A call made
while another thread is inside one (next(), set_epoch(), load_state_dict(),
close(), iter(), state_dict()) raises RuntimeError("npyload loader is in
use ...") naming both calls, and changes nothing; stats(), len() and the
read-only attributes may be read from any thread at any time, also while
next() waits.

Threads hammer close(), set_epoch(), load_state_dict() and iteration on one
loader, a bounded number of times. Each call must either succeed or be
refused with that RuntimeError (or, after a close() won, raise ValueError
"closed"). The hammering runs in a child process, so a heap corruption
(SIGABRT) or a segfault fails the test instead of killing pytest; a hang only
reaches a generous timeout. When the threads are done, the loader delivers
the order npyload.order_indices gives for the epoch its state_dict() reports
(independent truth: the order function, not a recorded run), and every
batch's values equal numpy's reading of the files.
"""
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

from conftest import N, to_numpy

HANG = 300  # seconds: only a hang (or a far too slow machine) ever reaches it
BS = 4

# The child: argv = json {"globs": ..., "scenario": ..., "rounds": ...}.
# Prints one json line: {"ok": bool, "problems": [...], "counts": {...}}.
CHILD = textwrap.dedent(r"""
    import json, random, sys, threading, time
    import numpy as np
    import npyload

    args = json.loads(sys.argv[1])
    globs, scenario, rounds = args["globs"], args["scenario"], args["rounds"]
    ref = {k: np.load(v) for k, v in args["ref"].items()}
    BS, SEED = 256, 11
    sys.setswitchinterval(1e-5)  # switch threads often: overlap is the point

    problems, counts = [], {"ok": 0, "in_use": 0, "closed": 0, "superseded": 0}
    lock = threading.Lock()

    def note(kind, what=None):
        with lock:
            if kind == "problem":
                if len(problems) < 20:
                    problems.append(what)
            else:
                counts[kind] += 1

    def attempt(fn, *a):
        try:
            fn(*a)
            note("ok")
            return True
        except RuntimeError as e:
            if "in use" in str(e):
                note("in_use")
            elif "superseded" in str(e):
                # Not an overlap: another thread's set_epoch() or
                # load_state_dict() came between two next() of a loop.
                note("superseded")
            else:
                note("problem", f"{fn.__name__}: {type(e).__name__}: {e}")
        except ValueError as e:
            if "closed" in str(e):
                note("closed")
            else:
                note("problem", f"{fn.__name__}: {type(e).__name__}: {e}")
        except BaseException as e:
            note("problem", f"{fn.__name__}: {type(e).__name__}: {e}")

    hook = (lambda b: b) if scenario.endswith("hook") else None

    def make():
        return npyload.Loader(globs, batch_size=BS, shuffle=True, seed=SEED,
                              num_workers=2, prefetch=2, output="numpy",
                              transform=hook)

    def full_order(epoch):
        return [int(i) for i in npyload.order_indices(
            len(ref["ids"]), 1, SEED, epoch, 0, 1, False, BS)]

    # States saved two batches into epochs 3 and 4 (by a loader of its own).
    saver = make()
    saved = []
    for e in (3, 4):
        saver.set_epoch(e)
        it = iter(saver)
        next(it), next(it)
        saved.append(saver.state_dict())
        del it
    saver.close()

    for r in range(rounds):
        L = make()
        stop = threading.Event()
        rng = random.Random(r)

        def pause():
            time.sleep(rng.random() * 0.0005)  # leaves the loader free at times

        def set_epochs():
            for i in range(30):
                attempt(L.set_epoch, (5, 7)[i % 2])
                pause()

        def load_states():
            for i in range(30):
                attempt(L.load_state_dict, saved[i % 2])
                pause()

        def iterate():
            def some():
                k = 0
                for b in L:
                    k += 1
                    if k == 3:
                        break
            for i in range(15):
                attempt(some)
                pause()

        def reads():
            # stats(), len() and repr() may overlap anything: they must
            # neither be refused nor crash (ValueError once closed).
            while not stop.is_set():
                attempt(L.stats)
                attempt(len, L)
                time.sleep(0.001)

        def closer():
            # After a random number of the others' calls, then until a
            # close() is not refused: the others go on against it.
            start = counts["ok"] + counts["in_use"] + rng.randrange(0, 80)
            while counts["ok"] + counts["in_use"] < start and not stop.is_set():
                time.sleep(0.0002)
            for i in range(100000):
                if attempt(L.close):
                    break
                time.sleep(0)

        workers = [set_epochs, set_epochs, load_states, iterate, reads]
        if scenario.startswith("close"):
            workers.append(closer)
        ts = [threading.Thread(target=w) for w in workers]
        for t in ts:
            t.start()
        for t in ts[:-2] if scenario.startswith("close") else ts[:-1]:
            t.join()
        stop.set()
        for t in ts:
            t.join()

        if scenario.startswith("close"):
            L.close()  # closing twice is fine
            continue
        # The dust has settled: the loader delivers the order of the epoch
        # its state reports (the whole epoch, or its rest after a resume),
        # or, when the last call was a loop (ended or left), of the next
        # epoch: a new iter() advances the epoch.
        st = L.state_dict()
        if L._live().pass_rule() == npyload._npyload.PASS_ADVANCE:  # (white-box: the
            # library's rule for what the next iter() runs)
            st = dict(st, epoch=st["epoch"] + 1, consumed=0)
        idx, epochs = [], set()
        for b in L:
            rows = np.asarray(b.indices)
            idx += rows.tolist()
            epochs.add(b.epoch)
            for name, arr in b.items():
                if not np.array_equal(arr, ref[name][rows]):
                    note("problem", f"round {r}: wrong values in {name}")
            del b
        full = full_order(st["epoch"])
        if idx != full and idx != full[st["consumed"]:]:
            note("problem", f"round {r}: state says epoch {st['epoch']} consumed "
                 f"{st['consumed']}, delivered {idx[:8]}..., order_indices gives "
                 f"{full[:8]}...")
        if epochs != {st["epoch"]}:
            note("problem", f"round {r}: batches of epochs {sorted(epochs)}, "
                 f"state says {st['epoch']}")
        L.close()

    print(json.dumps({"ok": not problems, "problems": problems, "counts": counts}),
          flush=True)
""")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Many samples (so that building an epoch's order takes a while and the
    threads' calls overlap in C), in two fields of two files each, and the
    fields' concatenations as the reference."""
    root = tmp_path_factory.mktemp("threads")
    n = 60000
    rng = np.random.default_rng(5)
    full = {"ids": np.arange(n, dtype=np.int64) * 3 + 1,
            "vals": rng.standard_normal((n, 2)).astype(np.float32)}
    globs, paths = {}, {}
    for name, arr in full.items():
        for i, part in enumerate((arr[:n // 3], arr[n // 3:])):
            np.save(root / f"{name}_{i:04d}.npy", part)
        globs[name] = str(root / f"{name}_*.npy")
        paths[name] = str(root / f"ref_{name}.npy.ref")
        with open(paths[name], "wb") as f:
            np.save(f, arr)
    return globs, paths


def run_child(big, scenario, rounds):
    globs, paths = big
    arg = json.dumps({"globs": globs, "ref": paths, "scenario": scenario, "rounds": rounds})
    p = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True,
                       timeout=HANG)
    assert p.returncode == 0, (
        f"the child {'died of signal ' + str(-p.returncode) if p.returncode < 0 else 'failed'}"
        f" (rc {p.returncode})\nstdout: {p.stdout[-3000:]}\nstderr: {p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["problems"] == [], res
    return res["counts"]


@pytest.mark.parametrize("scenario", ["settle", "settle-hook"])
def test_set_epoch_load_state_dict_and_iteration_race_then_order_is_right(big, scenario):
    counts = run_child(big, scenario, rounds=8)
    assert counts["ok"] > 0


@pytest.mark.parametrize("scenario", ["close", "close-hook"])
def test_close_racing_every_call_never_crashes(big, scenario):
    counts = run_child(big, scenario, rounds=8)
    assert counts["ok"] > 0


# ---- the refusal itself, deterministic (no race needed) ----

def make(globs, **kw):
    kw.setdefault("output", "numpy")
    kw.setdefault("batch_size", BS)
    kw.setdefault("num_workers", 1)
    return npyload.Loader(globs, **kw)


@pytest.mark.parametrize("call", ["close", "set_epoch", "load_state_dict", "iter"])
def test_calls_during_a_waiting_next_are_refused_naming_both(dataset, call):
    """While one thread is inside next() (here: a loop waiting for the
    transform= hook, held on batch 1), every other call is refused with
    RuntimeError naming the call in progress, and the loader is unchanged:
    the loop goes on with the batches it would have had. stats(), len() and
    state_dict() (with transform=: the position the loop has received) work
    meanwhile."""
    globs, ref = dataset
    gate = threading.Event()

    def fn(b):
        if b.seq == 1:
            assert gate.wait(HANG)
        return b

    L = make(globs, transform=fn, shuffle=True, seed=3)
    state0 = L.state_dict()
    got, errors = [], []

    def loop():
        try:
            for b in L:
                got.append(to_numpy(b.indices).tolist())
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=loop)
    t.start()
    try:
        # White-box wait (bounded) until the loop thread is inside next()
        # for batch 1, which the hook holds.
        for _ in range(HANG * 1000):
            if got and L._in_use.call == "next()":
                break
            threading.Event().wait(0.001)
        assert got and L._in_use.call == "next()"
        do = {"close": L.close, "set_epoch": lambda: L.set_epoch(4),
              "load_state_dict": lambda: L.load_state_dict(state0),
              "iter": lambda: iter(L)}[call]
        with pytest.raises(RuntimeError, match=r"in use: .* was called while next\(\) "
                           r"is running") as ei:
            do()
        assert (call + "()") in str(ei.value)
        assert L.stats()["batches_delivered"] >= 1
        assert len(L) == -(-N // BS)
        assert L.state_dict()["consumed"] == BS
    finally:
        gate.set()
        t.join(HANG)
    assert not errors, errors
    expected = np.array(npyload.order_indices(N, 1, 3, 0, 0, 1, False, BS))
    assert sum(got, []) == expected.tolist()
    L.close()


@pytest.mark.parametrize("call", ["set_epoch", "next"])
def test_ctrl_c_as_the_guard_is_taken_leaves_it_free(dataset, call):
    """Ctrl-C landing just after a call took the in-use guard and before its
    `with` block began (so no __exit__ gives it back): once the
    KeyboardInterrupt is handled, the loader is not "in use" for ever, and
    set_epoch and a whole epoch work. The interrupt is raised by a trace
    function as the guard's taking returns, the moment a signal can land."""
    import gc
    from npyload import _iterate
    globs, _ = dataset
    L = make(globs, output="numpy", num_workers=1)
    it = iter(L)
    take = _iterate._InUse._take.__code__
    fired = []

    def local(frame, event, arg):
        if event == "return" and not fired:
            fired.append(1)
            raise KeyboardInterrupt
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is take else None

    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            L.set_epoch(0) if call == "set_epoch" else next(it)
    finally:
        sys.settrace(None)
    assert fired
    del it
    gc.collect()
    L.set_epoch(0)
    got = [i for b in L for i in to_numpy(b.indices).tolist()]
    assert got == list(range(N))
    L.close()
