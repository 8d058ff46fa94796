"""``npyload.prefetch`` and ``npyload-prefetch``: fill a node's cache with a
dataset's remote objects before a job (a job scheduler's prologue), with
the C library's bulk fill (``npyload_prefetch``): large sequential ranged
GETs, several in flight, in sample order, within the cache's bound, and
coordinated with loaders reading the same ``cache_dir`` (one fetch per
block per node). The command line is this module's ``main`` (one source
for both)."""
from __future__ import annotations

import argparse
import json as _json
import os as _os
import sys as _sys
import threading as _threading
import time as _time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from . import _npyload, _remote

_Fields = Union[str, Sequence[str], Mapping[str, Union[str, Sequence[str]]]]


def _field_list(fields: _Fields) -> list[str | list[str]]:
    """Each field as a glob/URL (str) or a list of URLs."""
    if isinstance(fields, (str, _os.PathLike)):
        return [_os.fspath(fields)]
    if isinstance(fields, Mapping):
        out: list[str | list[str]] = []
        for name, v in fields.items():
            if isinstance(v, (str, _os.PathLike)):
                out.append(_os.fspath(v))
            elif isinstance(v, Sequence) and v and all(isinstance(p, str) for p in v):
                out.append(list(v))
            else:
                raise TypeError(f"prefetch: field {name!r} must be a glob or a non-empty list "
                                f"of URLs, got {type(v).__name__}")
        return out
    if isinstance(fields, Sequence) and all(isinstance(p, str) for p in fields):
        return list(fields)
    raise TypeError("prefetch: fields must be a mapping like Loader's, a list of globs or "
                    f"URLs, or one glob; got {type(fields).__name__}")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class _Bar:
    """A progress bar on stderr: redrawn in place on a terminal, a line
    every 10 % (and at the end) otherwise (a prologue's log)."""

    def __init__(self, stream: Any = None) -> None:
        self.out = stream or _sys.stderr
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.last_decile = -1

    def __call__(self, p: dict[str, Any]) -> None:
        if p["phase"] == "probing":
            text = f"npyload-prefetch: probing {p['objects']} objects"
            frac = 0.0
        else:
            plan = p["planned_bytes"]
            frac = p["cached_bytes"] / plan if plan else 1.0
            rate = p["fetched_bytes"] / max(p["seconds"], 1e-9)
            left = plan - p["cached_bytes"]
            eta = f", ETA {left / rate:.0f} s" if rate > 0 and left > 0 else ""
            width = 30
            fill = int(round(frac * width))
            part = "" if plan >= p["dataset_bytes"] else \
                f" (part: {_human(plan)} of {_human(p['dataset_bytes'])})"
            text = (f"npyload-prefetch [{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f} % "
                    f"{_human(p['cached_bytes'])}/{_human(plan)}{part} "
                    f"{_human(rate)}/s{eta}")
        if self.tty:
            self.out.write("\r" + text + "\x1b[K")
            if p["phase"] == "done":
                self.out.write("\n")
        else:
            decile = int(frac * 10)
            if decile == self.last_decile and p["phase"] != "done":
                return
            self.last_decile = decile
            self.out.write(text + "\n")
        self.out.flush()


def prefetch(fields: _Fields, *, remote: Mapping[str, Any] | None = None,
             cache_dir: str | _os.PathLike[str] | None = None,
             cache_bytes: int | None = None, cache_block: int | None = None,
             max_bytes: int | None = None, inflight: int | None = None,
             request_bytes: int | None = None,
             progress: bool | Callable[[dict[str, Any]], None] = False,
             interval: float = 0.25) -> dict[str, Any]:
    """Fill the cache directory that the node's loaders will use with the
    dataset's remote objects, before (or while) they read.

    fields
        As ``Loader``'s: a mapping from name to an ``s3://`` glob or a list
        of URLs; or a list of globs/URLs (one field each); or one glob.
        Fields are filled interleaved by sample position, so that a part of
        the dataset holds whole samples.
    remote
        ``Loader``'s ``remote=`` mapping (endpoint, credentials, ...; the
        AWS environment and ``~/.aws`` fill in what it lacks).
    cache_dir, cache_bytes, cache_block
        Override the same keys of ``remote``. ``cache_dir`` is required; give
        the loaders the same three (the block size is part of a block's name).
    max_bytes
        Fill at most this many bytes, the dataset's first part in sample
        order. Default and upper limit: 90 % of ``cache_bytes`` (what the
        cache keeps without evicting it again).
    inflight, request_bytes
        GETs at once (default 16) and bytes per GET (default 32 MiB, whole
        blocks of one object).
    progress
        True: a progress bar on stderr; a callable: called with the counters
        (the dict this function returns) every ``interval`` seconds and at
        the end; False: quiet.

    Returns the counters: ``objects``, ``dataset_bytes``, ``planned_bytes``
    (the part), ``cached_bytes`` (of the part, in the cache at the end),
    ``fetched_bytes``, ``planned_blocks``, ``found_blocks`` (already there),
    ``fetched_blocks``, ``waited_blocks`` (fetched meanwhile by a loader or
    another fill on the node), ``requests``, ``received_bytes``,
    ``seconds`` (of which ``probe_seconds`` probing), ``phase``, ``rc``.

    Safe to run while loaders read the same ``cache_dir``: a block is
    fetched once per node, whoever needs it first. Ctrl-C stops the fill
    (after the GETs in flight) and raises KeyboardInterrupt; what was
    filled stays. Raises NpyloadError naming the URL when a request fails
    for good, ValueError for a bad configuration.

    >>> npyload.prefetch({"images": "s3://bucket/images/train/*.npy.zst"},
    ...                  cache_dir="/local/npyload-cache", cache_bytes=400 << 30,
    ...                  progress=True)                        # doctest: +SKIP
    """
    flist = _field_list(fields)
    args = dict(remote or {})
    if cache_dir is not None:
        args["cache_dir"] = _os.fspath(cache_dir)
    if cache_bytes is not None:
        args["cache_bytes"] = cache_bytes
    if cache_block is not None:
        args["cache_block"] = cache_block
    if not args.get("cache_dir"):
        raise ValueError("prefetch: cache_dir is required (the directory the node's loaders "
                         "read through: remote={'cache_dir': ...})")
    paths = [p for f in flist for p in ([f] if isinstance(f, str) else f)]
    local = [p for p in paths if not _remote.is_remote(p)]
    if local:
        raise ValueError(f"prefetch: {local[0]!r} is not an s3:// or http(s):// path (a local "
                         "file needs no prefetch)")
    cfg = _remote.build(args, paths)
    assert cfg is not None
    P = _npyload.Prefetch(cfg)
    for opt, v, name in ((_npyload.PREFETCH_MAX_BYTES, max_bytes, "max_bytes"),
                         (_npyload.PREFETCH_INFLIGHT, inflight, "inflight"),
                         (_npyload.PREFETCH_REQUEST_BYTES, request_bytes, "request_bytes")):
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"prefetch: {name} must be an int, got {type(v).__name__}")
            try:
                P.set(opt, v)
            except _npyload.NpyloadError as e:
                raise ValueError(f"prefetch: {name}: {e}") from None
    for f in flist:
        if isinstance(f, str):
            P.add_field(f)
        else:
            P.add_field_files(f)
    show: Callable[[dict[str, Any]], None] | None
    show = _Bar() if progress is True else (progress if callable(progress) else None)
    # run() holds no GIL; it goes on a thread of its own so that this one
    # stays free for Ctrl-C (a signal is handled only between bytecodes of
    # the main thread) and for the progress.
    failure: list[BaseException] = []
    done = _threading.Event()

    def work() -> None:
        try:
            P.run()
        except BaseException as e:  # handed to the caller's thread
            failure.append(e)
        finally:
            done.set()

    # Waited for with an Event, not Thread.join: a join that Ctrl-C
    # interrupts marks the thread as finished on Python 3.11 (bpo-45274's
    # fix), and the run would be left behind at exit.
    _threading.Thread(target=work, name="npyload-prefetch", daemon=True).start()
    try:
        while not done.wait(interval):
            if show is not None:
                show(dict(P.progress()))
    except KeyboardInterrupt:
        P.stop()
        while not done.wait(1.0):
            pass
        raise
    final = dict(P.progress())
    if show is not None:
        show(final)
    if failure:
        raise failure[0]
    return final


def _bytes(s: str) -> int:
    """A size: 1234, 4M, 10G, 1.5T, 4MiB, 10GB (binary units: K = 1024)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = s.strip().lower()
    t = t[:-2] if t.endswith("ib") else t[:-1] if t.endswith("b") else t
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {s!r} (e.g. 4M, 10G)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``npyload-prefetch``: the command line of npyload.prefetch."""
    ap = argparse.ArgumentParser(
        prog="npyload-prefetch",
        description="Fill a node's npyload cache with a dataset's remote objects (s3://, "
                    "http(s)://) before a job: large sequential ranged GETs at link speed, "
                    "in sample order, within the cache's bound; safe while loaders of the "
                    "node read. The S3 endpoint and credentials come from the AWS "
                    "environment and ~/.aws, as for npyload.Loader.",
        epilog="example: npyload-prefetch --cache-dir /local/cache --cache-bytes 400G "
               "images=s3://bucket/images/train/*.npy.zst "
               "heatmaps=s3://bucket/labels/train/*_heatmaps.npy.zst")
    ap.add_argument("fields", nargs="+", metavar="[NAME=]GLOB",
                    help="a field: an s3:// glob or one URL (NAME= is optional)")
    ap.add_argument("--cache-dir", required=True, help="the cache directory of the node's "
                    "loaders (remote={'cache_dir': ...})")
    ap.add_argument("--cache-bytes", type=_bytes, help="its bound, as the loaders' "
                    "cache_bytes (default 10G)")
    ap.add_argument("--cache-block", type=_bytes, help="the loaders' cache_block "
                    "(default 4M)")
    ap.add_argument("--max-bytes", type=_bytes, help="fill at most this much, the "
                    "dataset's first part (default: 90%% of the cache's bound)")
    ap.add_argument("--inflight", type=int, help="GETs at once (default 16)")
    ap.add_argument("--request-bytes", type=_bytes, help="bytes per GET (default 32M)")
    ap.add_argument("--endpoint", help="the S3 endpoint (else AWS_ENDPOINT_URL_S3, "
                    "AWS_ENDPOINT_URL, the profile)")
    ap.add_argument("--region", help="the signing region (else AWS_REGION, ...)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--json", metavar="FILE", help="write the final counters to FILE "
                    "('-': stdout)")
    a = ap.parse_args(argv)
    fields: list[str] = []
    for f in a.fields:  # NAME= only labels the argument
        name, sep, pat = f.partition("=")
        fields.append(pat if sep and "://" not in name else f)
    remote: dict[str, Any] = {}
    if a.endpoint:
        remote["endpoint"] = a.endpoint
    if a.region:
        remote["region"] = a.region
    t0 = _time.monotonic()
    try:
        res = prefetch(fields, remote=remote, cache_dir=a.cache_dir,
                       cache_bytes=a.cache_bytes, cache_block=a.cache_block,
                       max_bytes=a.max_bytes, inflight=a.inflight,
                       request_bytes=a.request_bytes, progress=not a.no_progress)
    except KeyboardInterrupt:
        _sys.stderr.write("npyload-prefetch: interrupted; what was filled stays in the "
                          "cache\n")
        return 130
    except (_npyload.NpyloadError, ValueError, TypeError) as e:
        _sys.stderr.write(f"npyload-prefetch: {e}\n")
        return 1
    secs = _time.monotonic() - t0
    _sys.stderr.write(
        f"npyload-prefetch: {_human(res['cached_bytes'])} of {_human(res['planned_bytes'])} "
        f"in the cache ({res['found_blocks']} blocks were there, {res['fetched_blocks']} "
        f"fetched, {res['waited_blocks']} fetched by other readers), "
        f"{res['requests']} requests, {secs:.1f} s\n")
    if a.json:
        _write_json(a.json, res)
    return 0


def _write_json(path: str, obj: Any) -> None:
    """The --json FILE of the command lines ('-': stdout)."""
    text = _json.dumps(obj, indent=1, sort_keys=True, default=str)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as fh:
            fh.write(text + "\n")
