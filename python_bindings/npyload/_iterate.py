"""Iterating a Loader: the in-use guard (one call at a time) and the
iterator a ``for`` loop gets, which hands out the C loader's batches (or
the per-batch hook's results) until the pass ends."""
from __future__ import annotations

import threading as _threading
import time as _time
import weakref as _weakref
from typing import TYPE_CHECKING, Any

from ._hook import _EOF

if TYPE_CHECKING:
    from ._hook import _HookPipe
    from ._loader import Loader


class _InUse:
    """A Loader's in-use guard: one call at a time. ``with guard("set_epoch()"):``
    runs the body if no call is in progress, else raises RuntimeError naming
    both calls (never waits: an overlap is a bug in the caller). The C object
    has the same guard, with the same message, for its own state; this one
    also keeps the Python-level state (generation counter, hook thread, the C
    object itself, which load_state_dict may replace) whole.

    The call in progress is held through a weak reference to its `with`
    target (_Call), which the `with` statement keeps alive until it exits.
    Ctrl-C can land after the guard is taken and before the `with` block
    begins (in __enter__), so that no __exit__ gives it back; the target is
    then freed with the KeyboardInterrupt's traceback, and the next call
    finds the guard free instead of "in use" for ever."""

    __slots__ = ("_mu", "_holder")

    def __init__(self) -> None:
        self._mu = _threading.Lock()  # held for a few bytecodes only
        self._holder: _weakref.ref[_Call] | None = None

    def __call__(self, call: str) -> _Call:
        return _Call(self, call)

    def _current(self) -> _Call | None:
        return self._holder() if self._holder is not None else None

    @property
    def call(self) -> str | None:
        """The call in progress, or None."""
        h = self._current()
        return h.call if h is not None else None

    def _take(self, c: _Call) -> None:
        with self._mu:
            h = self._current()
            if h is None:
                self._holder = _weakref.ref(c)
                return
        raise RuntimeError(f"npyload loader is in use: {c.call} was called while {h.call} is "
                           "running (on another thread, or below this call); calls on one "
                           "loader must not overlap, only stats() and len() may run during "
                           "a next()")

    def _give(self, c: _Call) -> None:
        with self._mu:
            if self._current() is c:
                self._holder = None


class _Call:
    """One call's hold on an _InUse guard: the `with` statement's target."""

    __slots__ = ("guard", "call", "__weakref__")

    def __init__(self, guard: _InUse, call: str) -> None:
        self.guard = guard
        self.call = call

    def __enter__(self) -> _Call:
        self.guard._take(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.guard._give(self)


class _Iterator:
    __slots__ = ("_loader", "_gen", "_pipe")

    def __init__(self, loader: Loader[Any] | None, gen: int,
                 pipe: _HookPipe | None = None) -> None:
        self._loader = loader
        self._gen = gen
        self._pipe = pipe

    def __iter__(self) -> _Iterator:
        return self

    def _finish(self, ld: Loader[Any], eof: bool) -> None:
        self._loader = None
        if self._pipe is not None:
            self._pipe.stop()
            if ld._pipe is self._pipe:
                ld._pipe = None
            self._pipe = None

    def __next__(self) -> Any:
        ld = self._loader
        if ld is None:
            raise StopIteration
        with ld._in_use("next()"):
            return self._next(ld)

    def _next(self, ld: Loader[Any]) -> Any:
        if ld._gen != self._gen:
            self._finish(ld, False)
            raise RuntimeError("npyload: this iterator was superseded by a newer "
                               "iter(loader), set_epoch() or load_state_dict()")
        if self._pipe is not None:
            ld._live()
            t0 = _time.perf_counter_ns()
            err, out, state = self._pipe.get()
            ld._clock.waited(t0, _time.perf_counter_ns())
            if err is None or (err is _EOF and state is not None):
                ld._hook_state = state  # the loop's position (at the end: ended)
            if err is None:
                ld._log_auto()
                return out
            self._finish(ld, err is _EOF)
            if err is _EOF:
                raise StopIteration
            try:
                raise err
            finally:
                # The traceback holds this frame: a local naming err would
                # make a cycle (err -> traceback -> frame -> err) that keeps
                # the failed batch's slot (err.__cause__ -> fn's frame ->
                # batch) until the cyclic GC runs.
                del err
        raw = ld._c.next()
        if raw is None:
            self._finish(ld, True)
            raise StopIteration
        ld._log_auto()
        return ld._wrap(raw)

    def __len__(self) -> int:
        return len(self._loader) if self._loader is not None else 0

    def __del__(self) -> None:
        # `break` out of a loop frees the iterator: stop the hook thread so
        # it neither runs on nor holds slots.
        pipe = self._pipe
        if pipe is not None:
            self._pipe = None
            pipe.stop()
