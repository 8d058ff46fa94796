"""The per-batch ``transform=`` hook: a background pipeline that runs fn on
each batch, in order, at most ``prefetch`` batches ahead; TransformError."""
from __future__ import annotations

import sys as _sys
import queue as _queue
import threading as _threading
import time as _time
from typing import Any, Callable



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


class _LoopClock:
    """Where a loop with a ``transform=`` hook spends its time (ns): in fn on
    the hook thread (hook), waiting for the hook's results (wait), and
    between them (step, the training step as the loop ran it). One per
    Loader; += under the GIL."""
    __slots__ = ("hook_ns", "wait_ns", "step_ns", "last")

    def __init__(self) -> None:
        self.hook_ns = self.wait_ns = self.step_ns = self.last = 0

    def waited(self, t0: int, t1: int) -> None:
        if self.last:
            self.step_ns += t0 - self.last
        self.wait_ns += t1 - t0
        self.last = t1


def _hook_depth(prefetch: int) -> int:
    """Results queued by the transform= thread: with the one fn works on,
    `prefetch` batches ahead of the loop (at least one queued)."""
    return max(1, prefetch - 1)


class _HookPipe:
    """The ``transform=`` thread of one iteration: takes batches from the C
    loader in order, calls fn on each, and queues (error, result, state) with
    the C loader's state after that batch, so the consumer's state_dict()
    counts what it received. Holds no reference to the Loader or the
    iterator, so freeing the iterator (a `break`) can stop it.

    While it runs, this thread is the only caller of the C loader's next()
    and get_state(): the Loader stops it (stop()) before any call of its own
    that would overlap (set_epoch, load_state_dict, close, iter), and the
    consumer's stats() may overlap a waiting next() (the C object allows
    it)."""

    def __init__(self, c: Any, wrap: Callable[[Any], Any], fn: Callable[[Any], Any],
                 depth: int, stream: Any, clock: _LoopClock) -> None:
        self._c = c
        self._clock = clock
        self._wrap = wrap
        self._fn = fn
        self._stream = stream
        self._q: _queue.Queue[tuple[Any, Any, Any]] = _queue.Queue(depth)
        self._stop = _threading.Event()
        self._thread = _threading.Thread(target=self._run, name="npyload-transform",
                                         daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self._stream is not None:
                with _sys.modules["torch"].cuda.stream(self._stream):
                    self._loop()
            else:
                self._loop()
        except BaseException as e:  # a read error: delivered in order, as is
            self._put((e, None, None))

    def _loop(self) -> None:
        c, fn, stop = self._c, self._fn, self._stop
        while not stop.is_set():
            raw = c.next()
            state = None if raw is None else c.get_state()
            if raw is None:
                self._put((_EOF, None, None))
                return
            seq, epoch = raw.seq, raw.epoch
            batch = self._wrap(raw)
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
                self._put((self._failed(e, seq, epoch), None, None))
                return
            del batch
            self._clock.hook_ns += _time.perf_counter_ns() - t0
            # The put blocks while the queue is full; stop() drains it.
            self._put((None, out, state))
            del out

    @staticmethod
    def _failed(e: BaseException, seq: int, epoch: int) -> TransformError:
        err = TransformError(f"npyload: transform failed on batch seq={seq} of epoch "
                             f"{epoch}: {type(e).__name__}: {e}", seq, epoch)
        err.__cause__ = e
        return err

    def _put(self, item: tuple[Any, Any, Any]) -> None:
        if not self._stop.is_set():
            self._q.put(item)

    def get(self) -> tuple[Any, Any, Any]:
        while True:
            try:
                return self._q.get(timeout=0.1)
            except _queue.Empty:
                if not self._thread.is_alive() and self._q.empty():
                    raise RuntimeError("npyload: the transform thread was stopped") from None

    def _drain(self) -> None:
        try:
            while True:
                self._q.get_nowait()
        except _queue.Empty:
            pass

    def stop(self) -> None:
        """Stops the thread and drops what it queued (their slots go back).
        Waits for a running fn or next() to return; idempotent."""
        self._stop.set()
        t = self._thread
        if t is _threading.current_thread() or _sys.is_finalizing():
            return  # (at exit the daemon thread may never run again)
        while t.is_alive():
            self._drain()  # unblocks a put
            t.join(0.05)
        self._drain()
