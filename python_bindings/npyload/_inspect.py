"""``npyload.inspect``: the header facts of one .npy / .npy.zst, local or
remote (``s3://``, ``http(s)://``: ranged GETs of its header and, for a
.npy.zst, its seek table, with the configuration of ``_remote``: the
``remote=`` argument, else the AWS environment and ``~/.aws``)."""
from __future__ import annotations

import os as _os
from collections.abc import Mapping
from typing import Any, Union

from . import _manifest, _npyload, _remote

_Path = Union[str, "_os.PathLike[str]"]


def inspect_manifest(path: _Path, verify: bool = False, *,
                     remote: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The facts of a dataset manifest (``OUT/SPLIT.manifest.json`` that
    ``npyload.write`` writes; a local path or ``s3://``): the manifest as
    written (format, version, writer, split, samples, samples_per_file,
    fields with dtype, shape, packed and their files in order with path,
    samples, size, sha256), each file entry given ``location`` (its path or
    URL) and ``header`` (``npyload.inspect`` of that file). Every file's
    header is read (no data) and checked against the manifest: size,
    samples, per-sample shape, dtype. ``verify=True`` also reads every file
    and checks its sha256.

    Raises ValueError naming the manifest, the file and both values when a
    file differs from the manifest; NpyloadError when a file is not a
    readable NPY file; FileNotFoundError when one is missing."""
    p = _os.fspath(path)
    return _manifest.inspect(p, verify, remote)


def inspect(path: _Path, verify: bool = False, *,
            remote: Mapping[str, Any] | None = None) -> _npyload.HeaderInfo:
    """Header facts of one NPY file, read without loading the data: version
    (major, minor), descr, shape, fortran_order, itemsize, header_len,
    data_offset, data_bytes, file_bytes; a .npy.zst adds compressed_bytes,
    ratio, frames and samples_per_frame (``verify=True``: every frame
    decoded and checked, then verified and checksums). A narrowed file,
    packed or stored (``pack(..., narrow=True[, store=True])``), adds
    narrow_values (codes in its table) and value_descr (the dtype the
    loader delivers; descr is its codes', ``'|u1'``).

    An ``s3://`` or ``http(s)://`` path is read with ranged GETs (the first
    4 KiB; a .npy.zst's last 16 KiB and frame 0), giving the same facts as
    the local file. ``remote`` is ``Loader``'s ``remote=`` mapping; without
    it the AWS environment and ``~/.aws`` configure s3:// as for the loader.
    Raises NpyloadError naming the file (or URL) and what is wrong.

    A manifest's path (``...json``, see ``npyload.write``) gives
    ``inspect_manifest(path, verify, remote=remote)``'s facts instead (a dict
    of the dataset; typed code calls ``inspect_manifest``)."""
    p = _os.fspath(path)
    if _manifest.is_manifest(p):
        return inspect_manifest(p, verify, remote=remote)  # type: ignore[return-value]
    if isinstance(p, str) and _remote.is_remote(p):
        return _npyload.inspect(p, verify, _remote.build(remote, [p]))
    if remote is not None:
        raise ValueError(f"remote= applies to s3:// and http(s):// paths, not {p!r}")
    return _npyload.inspect(path, verify)
