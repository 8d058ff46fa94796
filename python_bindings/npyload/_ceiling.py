"""What this machine gives, measured by the C library through the loader's
own readers: the copy ceilings of a loader's bytes (npyload_loader_ceiling)
and the pinned host-to-device ceiling (npyload_cuda_h2d_bandwidth), so that
a loader's samples/s can be compared with them in the same run, as
npyload-bench does."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _npyload
from ._options import _int_arg

if TYPE_CHECKING:
    from ._loader import Loader

_KINDS = {"pread": _npyload.CEILING_PREAD, "gather": _npyload.CEILING_GATHER,
          "direct": _npyload.CEILING_DIRECT}


def copy_ceiling(loader: Loader[Any], kind: str = "pread", threads: int | None = None,
                 seconds: float = 1.0) -> dict[str, Any]:
    """The copy ceiling of ``loader``'s bytes on this machine.

    Parameters
    ----------
    loader : Loader
        Its fields (plain local ``.npy`` files), batch size and order are
        read as the loader reads them.
    kind : 'pread', 'gather' or 'direct'
        'pread': threads pread the samples of the loader's order, batch by
        batch, one request per sample and field (the page cache's copy
        ceiling); 'gather': the same as memcpy from the files mapped once
        (small rows); 'direct': one thread reads every file's data with
        O_DIRECT through io_uring (the disk's ceiling).
    threads : int or None
        Reading threads (None: the loader's num_workers, at least 1; 2 with
        num_workers='auto').
    seconds : float
        Measuring time (a short warm-up, then the best of three passes).

    Returns ``{"gbps": ..., "seconds": ..., "bytes": ..., "threads": ...}``
    (1e9 bytes/s). Raises NpyloadError for compressed, narrowed or remote
    fields, and RuntimeError ("in use") while another call on the loader
    runs.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "x_0.npy"), np.zeros((64, 256), np.float32))
    >>> loader = npyload.Loader({"x": os.path.join(d, "x_*.npy")}, batch_size=16,
    ...                         output="numpy")
    >>> c = npyload.copy_ceiling(loader, "pread", threads=1, seconds=0.3)
    >>> c["gbps"] > 0 and c["threads"] == 1
    True
    >>> loader.close()
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be 'pread', 'gather' or 'direct', got {kind!r}")
    workers = loader.num_workers if isinstance(loader.num_workers, int) else 2
    n = _int_arg("threads", threads if threads is not None else max(1, workers), 1,
                 maximum=256, what="reading threads")
    if not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
        raise ValueError(f"seconds = {seconds!r} out of range: > 0 and <= 3600")
    with loader._in_use("copy_ceiling()"):
        c = loader._live()
        result: dict[str, Any] = c.ceiling(_KINDS[kind], n, float(seconds))
        return result


def h2d_ceiling(device: int = 0, nbytes: int = 64 << 20, iters: int = 20) -> float:
    """Pinned host-to-device copy bandwidth of CUDA device ``device``, in
    GB/s (1e9 bytes/s): ``iters`` cudaMemcpyAsync of ``nbytes`` each on a
    stream of their own, what a loader's device copies compare with. Raises
    NpyloadError (code ENOCUDA) where CUDA is unusable.

    Examples
    --------
    >>> import npyload
    >>> ok, why = npyload.cuda_available()
    >>> (npyload.h2d_ceiling(0, 1 << 20, 3) > 0) if ok else True
    True
    """
    device = _int_arg("device", device, 0, maximum=1024)
    nbytes = _int_arg("nbytes", nbytes, 1, maximum=1 << 40, what="bytes per copy")
    iters = _int_arg("iters", iters, 1, maximum=1 << 20, what="copies")
    return float(_npyload.h2d_bandwidth(device, nbytes, iters))
