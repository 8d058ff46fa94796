"""Dataset manifests: what ``npyload.write`` writes last beside a split's
files (``OUT/SPLIT.manifest.json``), and what ``Loader`` opens instead of
listing: the fields with their files in order, each file's size (checked
at start) and sha256.

Format (JSON, ``"version": 1``)::

    {"format": "npyload-manifest", "version": 1,
     "writer": "npyload 0.3.0", "split": "train", "samples": 200,
     "samples_per_file": 64,
     "fields": {"images": {"dtype": "<f4", "shape": [2, 256, 512],
                           "packed": false,
                           "files": [{"path": "images/train/train_0000.npy",
                                      "samples": 64, "size": 67108992,
                                      "sha256": "..."}, ...]}, ...}}

``path`` is relative to the manifest's own directory (or prefix, for
``s3://``), with ``/`` separators; ``shape`` is one sample's; ``dtype`` is
the dtype delivered (a narrowed file's values, not its codes). A reader
refuses another ``format`` or a newer ``version``.
"""
from __future__ import annotations

import json as _json
import os as _os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor as _Pool
from typing import Any

from . import _remote

FORMAT = "npyload-manifest"
VERSION = 1
SUFFIX = ".manifest.json"


def name(split: str) -> str:
    """The manifest's name for a split, relative to out."""
    return split + SUFFIX


def is_manifest(fields: object) -> bool:
    """True when Loader's `fields` is a manifest's path (a str or PathLike
    ending in .json)."""
    if isinstance(fields, _os.PathLike):
        fields = _os.fspath(fields)
    return isinstance(fields, str) and fields.endswith(".json")


def build(split: str, samples: int, spf: int, fields: Mapping[str, Any],
          files: Mapping[str, list[tuple[str, int, int, str]]], version: str) -> bytes:
    """The manifest's bytes. fields: name -> {"dtype", "shape", "packed"};
    files: name -> [(relative path, samples, size, sha256)] in order."""
    d = {"format": FORMAT, "version": VERSION, "writer": f"npyload {version}",
         "split": split, "samples": samples, "samples_per_file": spf,
         "fields": {k: dict(v, files=[{"path": p, "samples": n, "size": size, "sha256": h}
                                       for p, n, size, h in files[k]])
                    for k, v in fields.items()}}
    return (_json.dumps(d, indent=1) + "\n").encode()


def parse(text: bytes | str, where: str) -> dict[str, Any]:
    """A manifest's dict, checked (format, version, the members a reader
    uses); ValueError naming `where` and what is wrong."""
    try:
        d = _json.loads(text)
    except ValueError as e:
        raise ValueError(f"{where}: not a JSON manifest: {e}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ValueError(f"{where}: not an npyload manifest (no \"format\": \"{FORMAT}\")")
    v = d.get("version")
    if not isinstance(v, int) or v < 1 or v > VERSION:
        raise ValueError(f"{where}: manifest version {v!r}; this npyload reads 1 .. {VERSION}")
    fields = d.get("fields")
    if not isinstance(fields, dict) or not fields:
        raise ValueError(f"{where}: the manifest has no fields")
    for k, f in fields.items():
        files = f.get("files") if isinstance(f, dict) else None
        if not isinstance(files, list) or not files or not all(
                isinstance(x, dict) and isinstance(x.get("path"), str) and
                isinstance(x.get("size"), int) and ".." not in x["path"].split("/") and
                not x["path"].startswith("/") for x in files):
            raise ValueError(f"{where}: field {k!r}: files must be a non-empty list of "
                             "{\"path\": relative path, \"size\": int, ...}")
    return d


def _read(path: str, remote: Mapping[str, Any] | None) -> bytes:
    if path.lower().startswith("s3://"):
        from ._write_s3 import S3Client
        return S3Client(path, remote).get_bytes(path)
    if _remote.is_remote(path):
        raise ValueError(f"{path}: a manifest is read from a local path or s3://")
    with open(path, "rb") as f:
        return f.read()


def _base(path: str) -> str:
    return path.rsplit("/", 1)[0] if _remote.is_remote(path) else _os.path.dirname(path)


def _size_of(url: str, remote: Mapping[str, Any] | None) -> int:
    from ._inspect import inspect
    h = inspect(url, remote=remote)
    return int(h["file_bytes"])


def _locations(path: str, d: Mapping[str, Any]) -> dict[str, list[str]]:
    """field -> the path (local) or URL (s3://) of each of its files."""
    base = _base(path)
    remote_base = _remote.is_remote(path)
    return {k: [(base + "/" + x["path"]) if remote_base else
                _os.path.join(base, *x["path"].split("/")) for x in f["files"]]
            for k, f in d["fields"].items()}


def _sha256(loc: str, remote: Mapping[str, Any] | None) -> str:
    import hashlib
    if not loc.lower().startswith("s3://"):
        from ._write_store import sha256_file
        return sha256_file(loc)
    from ._write_s3 import S3Client, _split_url
    bucket, key = _split_url(loc)
    body = S3Client(loc, remote).client.get_object(Bucket=bucket, Key=key)["Body"]
    h = hashlib.sha256()
    for chunk in iter(lambda: body.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def inspect(path: str, verify: bool = False,
            remote: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A manifest's facts (``npyload.inspect_manifest``): the manifest as
    written, each file entry given ``location`` (its path or URL) and
    ``header`` (``npyload.inspect`` of the file: only its header is read).
    Each file is checked against the manifest: its size, its sample count
    and per-sample shape, its dtype (a narrowed file's values' dtype);
    verify=True also reads every file and checks its sha256. ValueError
    names the file and both values."""
    from ._inspect import inspect as header_of
    d = parse(_read(path, remote), path)
    locs = _locations(path, d)
    for k, f in d["fields"].items():
        for x, loc in zip(f["files"], locs[k]):
            h: dict[str, Any] = dict(header_of(loc, remote=remote) if _remote.is_remote(loc)
                                     else header_of(loc))
            shape = list(h["shape"])
            dtype = h.get("value_descr", h["descr"])
            stored = h.get("compressed_bytes", h["file_bytes"])   # a .npy.zst: its own size
            for what, got, want in (("bytes", stored, x["size"]),
                                    ("samples", shape[0] if shape else None, x.get("samples")),
                                    ("sample shape", shape[1:], f.get("shape")),
                                    ("dtype", dtype, f.get("dtype"))):
                if want is not None and got != want:
                    raise ValueError(f"{path}: {loc}: {what} {got!r}, the manifest says "
                                     f"{want!r}")
            if verify and x.get("sha256") and _sha256(loc, remote) != x["sha256"]:
                raise ValueError(f"{path}: {loc}: its sha256 differs from the manifest's: "
                                 "the file changed since it was written")
            x["location"], x["header"] = loc, h
    return d


def fields_of(fields: Any, remote: Mapping[str, Any] | None = None) -> Any:
    """Loader's `fields` as given, or, for a manifest's path, the mapping
    field -> its files (no listing), after checking every file's size
    against the manifest (local: stat; s3://: the object's size, read as the
    loader's start reads it). ValueError names the file and both sizes."""
    if not is_manifest(fields):
        return fields
    path = _os.fspath(fields)
    d = parse(_read(path, remote), path)
    remote_base = _remote.is_remote(path)
    out = _locations(path, d)
    checks: list[tuple[str, int]] = []
    for k, f in d["fields"].items():
        checks += [(p, x["size"]) for p, x in zip(out[k], f["files"])]
    if remote_base:
        with _Pool(max_workers=min(16, len(checks))) as pool:
            sizes = list(pool.map(lambda c: _size_of(c[0], remote), checks))
    else:
        sizes = []
        for p, _ in checks:
            try:
                sizes.append(_os.stat(p).st_size)
            except OSError as e:
                raise ValueError(f"{path}: {p}: {e.strerror}") from None
    for (p, want), got in zip(checks, sizes):
        if got != want:
            raise ValueError(f"{path}: {p} holds {got} bytes, the manifest says {want}: "
                             "the file changed since it was written")
    return out
