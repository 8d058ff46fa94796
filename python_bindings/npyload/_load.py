"""npyload.load: one shard back as a numpy array, whatever form npyload
wrote it in (.npy, .npy.zst, narrowed stored or packed)."""
from __future__ import annotations

import os
import os as _os
from typing import TYPE_CHECKING, Any

from . import _npyload

if TYPE_CHECKING:   # numpy is imported when used: the package imports without it
    import numpy.typing as _npt


def load(path: str | os.PathLike[str] | bytes, mmap: bool = True) -> _npt.NDArray[Any]:
    """One file as a numpy array: a plain ``.npy`` (with ``mmap=True`` a
    read-only ``numpy.memmap``, nothing read until used; else read into a new
    array), or a ``.npy.zst`` (npyload-pack, ``npyload.write(pack=True)``)
    and either narrowed form (``narrow=True``, stored or packed): those are
    decoded with the loader's own reader into a new array of the values the
    loader delivers (the narrowed codes turned back into their values, bit for
    bit), so ``mmap`` does not apply to them.

    ``np.load`` cannot read a ``.npy.zst`` (it reports "pickled (object)
    data"); use this, or ``zstd -d FILE.npy.zst`` to restore the ``.npy``.

    Raises NpyloadError naming the file for a malformed or truncated one.

    >>> import numpy as np, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "a.npy"), np.arange(6, dtype=np.float32).reshape(3, 2))
    >>> load(os.path.join(d, "a.npy"), mmap=False).tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """
    info = _npyload.inspect(path)
    if "compressed_bytes" not in info and "narrow_values" not in info:
        return _npyload.load(path, mmap=mmap)
    import numpy as _np
    from ._loader import Loader  # the loader's reader decodes frames and tables
    shape = tuple(info["shape"])
    dtype = _np.dtype(info.get("value_descr", info["descr"]))
    n = shape[0] if shape else 0
    if n == 0:
        return _np.empty(shape, dtype)
    name = _os.fsdecode(path)
    with Loader({"a": [name]}, batch_size=n, output="numpy", copy=True,
                num_workers=0) as ld:
        out: _npt.NDArray[Any] = next(iter(ld))["a"]
    return out
