"""Packing .npy files into seekable .npy.zst shards (the C packer)."""
from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING

from . import _npyload
from ._npyload import NpyloadError
from ._options import _int_arg

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._npyload import PackResult, _Path


_PACK_LEVELS = (-131072, 22)     # zstd's ZSTD_minCLevel() .. ZSTD_maxCLevel()


_PACK_MAX_FRAME = 1 << 30        # bytes: the seekable format's frame limit


_PACK_MAX_THREADS = 1024


def pack(paths: _Path | Iterable[_Path], level: int = 3, frame_size: int | None = None,
         threads: int | None = None, force: bool = False, remove: bool = False,
         out: _Path | None = None, checksum: bool = True,
         narrow: bool = False, store: bool = False) -> list[PackResult]:
    """Compresses NPY files into seekable ``FILE.npy.zst`` shards, with the
    same C code as ``npyload-pack`` (``npyload_pack_file``) and its options.

    Parameters
    ----------
    paths
        One path or a list of paths of ``.npy`` files;
    level
        Zstd level (``-l``; negative levels are faster);
    frame_size
        Target decompressed bytes per frame (``--frame-size``):
        each frame holds the fewest whole samples reaching it (None: 128 KiB);
    threads
        Compression threads (``-T``; None or 0: all cores);
    force
        Replace existing outputs (``-f``); without it an existing
        output raises NpyloadError (``code == -errno.EEXIST``);
    remove
        Delete each input once it is packed (``--rm``);
    out
        The output path (``-o``), with exactly one input;
    checksum
        Frame checksums (False is ``--no-check``).
    narrow
        Lossless narrowing (``--narrow``): a file whose values (2,
        4 or 8 bytes each) are at most 256 distinct bit patterns is stored as
        one-byte codes plus the table of values; the loader delivers the
        original values bit for bit (with a CUDA device=, the codes cross
        PCIe and a kernel expands them). A file with more distinct values,
        or of another dtype, raises NpyloadError naming it. ``zstd -d`` of
        such a file gives a .npy of the uint8 codes (README, "Narrowing").
    store
        (with ``narrow``; ``--store``): the codes without
        compression, as ``FILE.narrow.npy``: a plain .npy of the uint8 codes
        (``np.load`` gives the codes) followed by a trailer holding the value
        table; the loader delivers the values and reads cost no decode.

    Notes
    -----
    Each output is written as a nameless temporary file in its directory,
    synced to disk, and only then linked under its name (the directory
    synced after): an error, Ctrl-C (KeyboardInterrupt) or a power loss
    never leaves a partial file under the final name. ``force`` replaces
    regular files only: a device, FIFO, socket, directory or symbolic link at
    ``out`` raises NpyloadError naming it. An input modified while it is
    packed raises NpyloadError naming it (nothing written).
    Numbers out of range raise ValueError naming the argument and its range:
    ``level`` -131072 .. 22 (0: the default), ``frame_size`` 1 .. 1 GiB,
    ``threads`` 0 .. 1024. Files are packed in order; the first failure raises
    NpyloadError naming the file (earlier outputs stay). Returns one dict per
    input: ``in_bytes``, ``out_bytes``, ``frames`` (frame 0, the header, in),
    ``samples_per_frame``, ``seconds``, ``out``, ``narrow_values`` (the codes
    of a narrowed file, else 0). ``zstd -d`` restores each ``.npy`` byte for
    byte (a narrowed one: the .npy of its codes).

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> import npyload
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npy")
    >>> np.save(p, np.arange(64 * 128, dtype=np.float32).reshape(64, 128))
    >>> [(r["out"] == p + ".zst", r["frames"]) for r in npyload.pack(p)]
    [(True, 2)]
    >>> loader = npyload.Loader({"a": p + ".zst"}, batch_size=64, output="numpy")
    >>> np.array_equal(next(iter(loader))["a"], np.load(p))
    True
    """
    if isinstance(paths, (str, bytes, _os.PathLike)):
        paths = [paths]
    files = [_os.fsdecode(_os.fspath(p)) for p in paths]
    if not files:
        raise ValueError("pack: no input file")
    if out is not None:
        if len(files) != 1:
            raise ValueError(f"pack: out names one output: give exactly one "
                             f"input (got {len(files)})")
        out = _os.fsdecode(_os.fspath(out))
    # The ranges of npyload_pack_file, checked here so that a bad value is a
    # ValueError naming it before any file is touched.
    level = _int_arg("level", level)
    if level != 0 and not _PACK_LEVELS[0] <= level <= _PACK_LEVELS[1]:
        raise ValueError(f"pack: level={level} out of range ({_PACK_LEVELS[0]} "
                         f".. {_PACK_LEVELS[1]}; 0 = the default 3)")
    frame_size = _int_arg("frame_size", frame_size, allow_none=True)
    if frame_size is not None and not 1 <= frame_size <= _PACK_MAX_FRAME:
        raise ValueError(f"pack: frame_size={frame_size} out of range (1 .. "
                         f"{_PACK_MAX_FRAME} bytes; None = 131072)")
    threads = _int_arg("threads", threads, allow_none=True)
    if threads is not None and not 0 <= threads <= _PACK_MAX_THREADS:
        raise ValueError(f"pack: threads={threads} out of range (0 .. "
                         f"{_PACK_MAX_THREADS}; None or 0 = all cores)")
    results = []
    for p in files:
        r = _npyload.pack_file(p, out, level, frame_size or 0, threads or 0,
                               bool(force), bool(checksum), bool(narrow), bool(store))
        if remove:
            try:
                _os.unlink(p)
            except OSError as e:
                err = NpyloadError(f"{p}: packed, but cannot remove it: "
                                   f"{e.strerror}")
                err.code = -(e.errno or 0)
                raise err from e
        results.append(r)
    return results
