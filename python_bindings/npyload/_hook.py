"""The per-batch ``transform=`` hook: a background pipeline that runs fn on
each batch on ``transform_workers`` threads, delivered in order, at most
``prefetch`` batches ahead; the per-batch generator; TransformError."""
from __future__ import annotations

import contextlib as _contextlib
import sys as _sys
import threading as _threading
import time as _time
from typing import Any, Callable, Iterator

from ._options import _int_arg


class TransformError(RuntimeError):
    """Raised from iteration when the ``transform=`` hook failed on a batch.

    ``seq`` and ``epoch`` name the batch; the exception the hook raised is
    chained as ``__cause__``. The batches before it were delivered.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "y_0.npy"), np.arange(10))
    >>> def hook(batch):
    ...     raise ValueError("bad batch")
    >>> loader = npyload.Loader({"y": os.path.join(d, "y_0.npy")}, batch_size=4,
    ...                         transform=hook, output="numpy")
    >>> try:
    ...     next(iter(loader))
    ... except npyload.TransformError as e:
    ...     print(e.seq, e.epoch, repr(e.__cause__))
    0 0 ValueError('bad batch')
    """

    def __init__(self, message: str, seq: int, epoch: int) -> None:
        super().__init__(message)
        self.seq = seq
        self.epoch = epoch


_EOF = object()

# Threads of one loader's hook, at most (threads, not processes: fn's torch
# ops release the GIL; beyond a few per core nothing is gained).
_HOOK_WORKERS_MAX = 256


def _check_hook_workers(transform_workers: Any, transform: Any) -> int:
    """Loader's ``transform_workers``: an int 1 .. 256, above 1 only with a
    ``transform=`` to run."""
    n = _int_arg("transform_workers", transform_workers, 1, maximum=_HOOK_WORKERS_MAX,
                 what="threads running the transform= hook")
    if n > 1 and transform is None:
        raise ValueError(f"transform_workers = {n} needs transform= (a per-batch "
                         "function for the threads to run)")
    return n


def _hook_prefetch(default: int, workers: int) -> int:
    """Loader's prefetch when none is given: the library's default, raised
    so that every hook thread can hold a batch with one result queued."""
    return default if workers == 1 else max(default, workers + 1)


def hook_rng(seed: int, epoch: int, seq: int, rank: int = 0) -> Any:
    """The ``numpy.random.Generator`` a ``transform=`` hook finds as
    ``batch.rng``: PCG64 seeded by numpy's SeedSequence from the four 64-bit
    words (seed mod 2**64, epoch, rank, seq), each as two little-endian
    32-bit words (fixed width, so no two tuples share a seed):

        words = numpy.array([seed % 2**64, epoch, rank, seq], dtype="<u8").view("<u4")
        numpy.random.Generator(numpy.random.PCG64(numpy.random.SeedSequence(words)))

    A pure function of the loader's seed, the batch's epoch and seq, and the
    rank: the same draws for any transform_workers, num_workers, backend or
    resume at the same world size."""
    import numpy as np
    words = np.array([seed % (1 << 64), epoch, rank, seq], dtype="<u8").view("<u4")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def _rng_key(seed: int, rank: int) -> tuple[int, int] | None:
    """_HookPipe's rng argument: (seed, rank) for batch.rng, or None where
    numpy is not importable (a torch-only install: batch.rng is None)."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        return None
    return (seed, rank)


def _with_rng(batch: Any, rng: Any) -> Any:
    """batch (a Batch or a BatchTuple, or whatever the wrap gave) with its
    ``rng`` member set."""
    batch.rng = rng
    return batch


class _LoopClock:
    """Where a loop with a ``transform=`` hook spends its time (ns): in fn on
    the hook threads (hook, summed over the threads), waiting for the hook's
    results (wait), and between them (step, the training step as the loop
    ran it). One per Loader; wait and step are written by the loop, hook
    under the pipe's lock. ``workers``: the hook's threads, which the
    verdict's share of hook time is divided by (the hook limits the loop
    when its threads are busy, not when their sum passes half the time)."""
    __slots__ = ("hook_ns", "wait_ns", "step_ns", "last", "workers")

    def __init__(self, workers: int = 1) -> None:
        self.hook_ns = self.wait_ns = self.step_ns = self.last = 0
        self.workers = workers

    def waited(self, t0: int, t1: int) -> None:
        if self.last:
            self.step_ns += t0 - self.last
        self.wait_ns += t1 - t0
        self.last = t1

    def verdict_hook_ns(self) -> int:
        """hook_ns per hook thread: what npyload_stats_verdict's "hook >=
        50 % of the time" rule compares."""
        return self.hook_ns // self.workers


@_contextlib.contextmanager
def _ctrl_c_as_pressed() -> Iterator[None]:
    """Hands the user the KeyboardInterrupt they pressed. CPython's
    Condition.wait, when Ctrl-C lands while it takes its lock back, leaves
    its `with` without the lock and raises RuntimeError ("release unlocked
    lock", or "cannot release un-acquired lock" for an RLock), the
    KeyboardInterrupt as its context (the lock is left released, as after
    any `with`)."""
    try:
        yield
    except RuntimeError as e:
        ki = e.__context__
        if isinstance(ki, KeyboardInterrupt) and ("unlocked lock" in str(e)
                                                  or "un-acquired lock" in str(e)):
            raise ki from None
        raise


def _hook_depth(prefetch: int) -> int:
    """Results queued by the transform= threads: with the one fn works on,
    `prefetch` batches ahead of the loop (at least one queued)."""
    return max(1, prefetch - 1)


def _slots_for(prefetch: int, transform: object) -> int:
    """The library's PREFETCH (batch slots) for `prefetch` batches ahead.
    With transform=, the loop body may hold two batches for a moment (the
    previous one and the one just taken from the queue, before the `for`
    rebinds its variable), the queue holds its results, and the thread's
    next() needs a free slot to read into."""
    if transform is None:
        return prefetch + 1
    return _hook_depth(prefetch) + 3


class _HookPipe:
    """The ``transform=`` threads of one iteration. Each takes the next batch
    from the C loader (one at a time, under _next_lock, numbering it k in the
    C loader's order), calls fn on it, and files (error, result, state) under
    k, with the C loader's state after that batch so that the consumer's
    state_dict() counts what it received; get() hands them out in k order.
    A thread takes a batch only with a permit: at most depth + 1 batches are
    taken and not yet handed out (queued, in fn, or being read), whatever
    the number of threads, so the slots stay bounded as with one thread.
    Holds no reference to the Loader or the iterator, so freeing the
    iterator (a `break`) can stop it.

    While it runs, its threads are the only callers of the C loader's next()
    and get_state(), one at a time: the Loader stops it (stop()) before any
    call of its own that would overlap (set_epoch, load_state_dict, close,
    iter), and the consumer's stats() may overlap a waiting next() (the C
    object allows it)."""

    def __init__(self, c: Any, wrap: Callable[[Any], Any], fn: Callable[[Any], Any],
                 depth: int, stream: Any, clock: _LoopClock, workers: int = 1,
                 rng: tuple[int, int] | None = None) -> None:
        self._c = c
        self._clock = clock
        self._wrap = wrap
        self._fn = fn
        self._stream = stream
        self._rng = rng          # (seed, rank) for batch.rng; None: batch.rng is None
        self._cv = _threading.Condition()
        self._next_lock = _threading.Lock()
        self._permits = depth + 1  # batches that may be taken, not handed out
        self._taken = 0          # k of the next batch taken from the C loader
        self._given = 0          # k of the next result get() hands out
        self._done: dict[int, tuple[Any, Any, Any]] = {}  # k -> (error, result, state)
        self._end = False        # EOF or an error filed: take no more batches
        self._stop = False
        self._threads = [_threading.Thread(target=self._run, name="npyload-transform",
                                           daemon=True) for _ in range(workers)]
        self._started: list[_threading.Thread] = []  # those start() started
        self._running = 0        # threads inside _run's work (stop waits for none)

    def start(self) -> None:
        """Starts the threads. Interrupted (Ctrl-C lands while a thread
        starts: Thread.start waits for it), it stops those already started
        before raising, so that none runs on without an owner, holding
        slots or sitting in the C loader's next()."""
        with _ctrl_c_as_pressed():
            try:
                for t in self._threads:
                    t.start()
                    self._started.append(t)
            except BaseException:
                self.stop()
                raise

    def _run(self) -> None:
        with self._cv:
            if self._stop:
                return  # stopped before this thread began: it does nothing
            self._running += 1
        try:
            self._run_loop()
        finally:
            with self._cv:
                self._running -= 1
                self._cv.notify_all()

    def _run_loop(self) -> None:
        try:
            if self._stream is not None:
                with _sys.modules["torch"].cuda.stream(self._stream):
                    self._loop()
            else:
                self._loop()
        except BaseException as e:  # (entering the stream failed): in order, as is
            with self._next_lock:
                k = self._taken
                self._taken = k + 1
                self._file(k, (e, None, None), end=True)

    def _take(self) -> bool:
        """Waits for a permit; False once stopped or ended."""
        with self._cv:
            while not self._permits and not (self._stop or self._end):
                self._cv.wait()
            if self._stop or self._end:
                return False
            self._permits -= 1
            return True

    def _loop(self) -> None:
        c, fn = self._c, self._fn
        while self._take():
            with self._next_lock:
                if self._stop or self._end:
                    return
                k = self._taken
                self._taken = k + 1
                try:
                    raw = c.next()
                    state = None if raw is None else c.get_state()
                except BaseException as e:  # a read error: delivered in order, as is
                    self._file(k, (e, None, None), end=True)
                    return
                if raw is None:  # the pass ended: its state says so
                    self._file(k, (_EOF, None, c.get_state()), end=True)
                    return
            if self._stop:
                return  # raw's slot is given back with this frame
            seq, epoch = raw.seq, raw.epoch
            try:
                batch = self._batch(raw, seq, epoch)
            except BaseException as e:
                del raw
                self._file(k, (e, None, None), end=True)
                return
            del raw
            t0 = _time.perf_counter_ns()
            try:
                out = fn(batch)
            except BaseException as e:
                # No local may keep the batch or the error: e's traceback
                # keeps this frame (and fn's, which holds the batch while the
                # error lives: freed with it, by reference counting, as long
                # as no cycle holds the error; see _Iterator.__next__).
                del batch
                self._file(k, (self._failed(e, seq, epoch), None, None), end=True)
                return
            del batch
            self._file(k, (None, out, state), _time.perf_counter_ns() - t0)
            del out

    def _batch(self, raw: Any, seq: int, epoch: int) -> Any:
        """What fn is given: the wrapped batch with ``rng`` (None without numpy)."""
        key = self._rng
        rng = None if key is None else hook_rng(key[0], epoch, seq, key[1])
        return _with_rng(self._wrap(raw), rng)

    @staticmethod
    def _failed(e: BaseException, seq: int, epoch: int) -> TransformError:
        err = TransformError(f"npyload: transform failed on batch seq={seq} of epoch "
                             f"{epoch}: {type(e).__name__}: {e}", seq, epoch)
        err.__cause__ = e
        return err

    def _file(self, k: int, item: tuple[Any, Any, Any], hook_ns: int = 0,
              end: bool = False) -> None:
        with self._cv:
            self._clock.hook_ns += hook_ns
            if end:
                self._end = True
            if not self._stop:
                self._done[k] = item
            self._cv.notify_all()

    def get(self) -> tuple[Any, Any, Any]:
        """The next result in order: (error or _EOF or None, result, state)."""
        with _ctrl_c_as_pressed(), self._cv:
            while True:
                item = self._done.pop(self._given, None)
                if item is not None:
                    self._given += 1
                    self._permits += 1
                    self._cv.notify_all()
                    return item
                if not any(t.is_alive() for t in self._started):
                    raise RuntimeError("npyload: the transform thread was stopped")
                self._cv.wait(0.1)

    def stop(self) -> None:
        """Stops the threads and drops what they filed (their slots go back).
        Waits for running fn or next() calls to return (not when called on
        one of the threads, whose siblings then stop on their own);
        idempotent."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        me = _threading.current_thread()
        if me in self._threads or _sys.is_finalizing():
            return  # (at exit the daemon threads may never run again)
        # A thread whose start() was interrupted may run all the same (it
        # had not yet said it began): the count covers it, a join could not.
        with self._cv:
            while self._running:
                self._cv.wait()
        for t in self._started:
            t.join()
        with self._cv:
            done, self._done = self._done, {}
        done.clear()  # outside the lock: freeing a batch gives its slot back

