"""Where npyload.write puts files: a local directory (this module) and
object storage (``_write_s3``), behind one small table of operations that
the writer's planning (``_write``) uses without asking which it is.

A store answers, per relative path, what is there (nothing, a file of ours
with its content checksum, or a file the writer did not make), writes a
file so that it appears whole or not at all, removes a file of ours, and
keeps, per split, the call's fingerprint and whether its write completed.

Locally that knowledge lives in a journal beside the files
(``.npyload-write.journal``, JSON lines, fsynced): a file is the writer's
only when the journal says so, so a user's own file is never replaced or
adopted, and a write is resumed only over files whose recorded content
checksum equals the new data's. An exclusive ``flock`` on
``.npyload-write.lock`` keeps a second writer out.
"""
from __future__ import annotations

import errno as _errno
import fcntl as _fcntl
import hashlib as _hashlib
import json as _json
import os as _os
import socket as _socket
import threading as _threading
import time as _time
from dataclasses import dataclass, field
from typing import Any

JOURNAL = ".npyload-write.journal"
LOCK = ".npyload-write.lock"


@dataclass
class Entry:
    """A file the writer made: its split, file number and field, the
    sha256 of the NPY bytes it was made from (``content``), and the file as
    stored (size, sha256). ``pending``: the writer started it and may not
    have finished (a crash between the two journal lines); ``stamp``:
    (inode, mtime_ns) locally, to tell that the file is still the one
    written."""
    path: str
    split: str
    fid: int
    field: str
    content: str = ""
    size: int = -1
    sha256: str = ""
    stamp: tuple[int, int] = (0, 0)
    pending: bool = False


@dataclass
class Record:
    """One split's write: its call's fingerprint, and ``samples`` (the count)
    once it completed, else None."""
    spec: str
    samples: int | None = None
    files: dict[str, Entry] = field(default_factory=dict)


FOREIGN = "foreign"   # what entry() says of a file the writer did not make


def sha256_file(path: str) -> str:
    h = _hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(d: str) -> None:
    fd = _os.open(d, _os.O_RDONLY | _os.O_DIRECTORY)
    try:
        _os.fsync(fd)
    finally:
        _os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """data to path through a temporary name in its directory: written,
    fsynced, renamed, the directory fsynced (npyload-pack's rules): a killed
    write never leaves a partial file under the final name, and a failed one
    (ENOSPC, EFBIG, EIO...) leaves no temporary file holding the space."""
    d = _os.path.dirname(path) or "."
    _os.makedirs(d, exist_ok=True)
    tmp = _os.path.join(d, f".{_os.path.basename(path)}.tmp-{_os.getpid()}-"
                           f"{_threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            _os.fsync(f.fileno())
        _os.replace(tmp, path)
    except BaseException:
        try:
            _os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)


class LocalStore:
    """`out` on a local filesystem."""

    def __init__(self, out: str) -> None:
        self.out = _os.path.abspath(out)
        self.real = ""
        self.records: dict[str, Record] = {}
        self._owner: dict[str, Entry] = {}     # path -> entry, every split
        self._mu = _threading.Lock()
        self._jf: Any = None
        self._lock_fd = -1

    def where(self, rel: str) -> str:
        return _os.path.join(self.out, rel)

    # ---- the lock -----------------------------------------------------------
    def open(self) -> None:
        """Takes the lock (or raises BlockingIOError naming its holder) and
        reads the journal."""
        _os.makedirs(self.out, exist_ok=True)
        self.real = _os.path.realpath(self.out)
        lock = self.where(LOCK)
        fd = _os.open(lock, _os.O_RDWR | _os.O_CREAT | _os.O_CLOEXEC, 0o644)
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        except OSError as e:
            holder = _os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown"
            _os.close(fd)
            if e.errno in (_errno.EWOULDBLOCK, _errno.EAGAIN):
                raise BlockingIOError(
                    e.errno, f"write: {self.out} is being written by another writer "
                    f"({holder}; lock {lock}): wait for it or write elsewhere") from None
            raise
        _os.ftruncate(fd, 0)
        _os.pwrite(fd, f"pid {_os.getpid()} on {_socket.gethostname()} since "
                       f"{_time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        self._lock_fd = fd
        self._load()

    def close(self) -> None:
        if self._jf is not None:
            self._jf.close()
            self._jf = None
        if self._lock_fd >= 0:
            _os.ftruncate(self._lock_fd, 0)
            _os.close(self._lock_fd)   # releases the flock
            self._lock_fd = -1

    # ---- the journal --------------------------------------------------------
    def _load(self) -> None:
        path = self.where(JOURNAL)
        lines: list[str] = []
        if _os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        for i, line in enumerate(lines):
            try:
                self._apply(_json.loads(line))
            except (ValueError, KeyError, TypeError):
                if i != len(lines) - 1:   # only the last line may be torn by a kill
                    raise ValueError(f"write: {path}: line {i + 1} is damaged; the "
                                     "journal tells which files the writer made: "
                                     "restore it or remove the directory") from None
        # A writer killed while compacting left its temporary copy of the
        # journal: it is no file of the output (the lock is ours now).
        _remove_temps(path)
        # Compacted: the state as it is, one line per fact.
        compact = [_json.dumps({"op": "spec", "split": s, "spec": r.spec})
                   for s, r in self.records.items()]
        compact += [self._file_line(e) for e in self._owner.values()]
        compact += [_json.dumps({"op": "complete", "split": s, "samples": r.samples})
                    for s, r in self.records.items() if r.samples is not None]
        write_atomic(path, ("\n".join(compact) + "\n").encode() if compact else b"")
        self._jf = open(path, "a", encoding="utf-8")

    @staticmethod
    def _file_line(e: Entry) -> str:
        if e.pending:
            return _json.dumps({"op": "intent", "path": e.path, "split": e.split,
                                "fid": e.fid, "field": e.field})
        return _json.dumps({"op": "file", "path": e.path, "split": e.split, "fid": e.fid,
                            "field": e.field, "content": e.content, "size": e.size,
                            "sha256": e.sha256, "stamp": list(e.stamp)})

    def _apply(self, d: dict[str, Any]) -> None:
        op = d["op"]
        if op == "spec":
            self.records.setdefault(d["split"], Record(d["spec"])).spec = d["spec"]
        elif op in ("intent", "file"):
            e = Entry(d["path"], d["split"], int(d["fid"]), d["field"],
                      pending=op == "intent")
            if op == "file":
                e.content, e.size, e.sha256 = d["content"], int(d["size"]), d["sha256"]
                e.stamp = (int(d["stamp"][0]), int(d["stamp"][1]))
            self._forget(e.path)
            self._owner[e.path] = e
            self.records.setdefault(e.split, Record("")).files[e.path] = e
        elif op == "gone":
            self._forget(d["path"])
        elif op == "drop":
            self.records.pop(d["split"], None)
        elif op == "complete":
            self.records[d["split"]].samples = d["samples"]
        elif op == "incomplete":
            if d["split"] in self.records:
                self.records[d["split"]].samples = None

    def _forget(self, path: str) -> None:
        old = self._owner.pop(path, None)
        if old is not None and old.split in self.records:
            self.records[old.split].files.pop(path, None)

    def _append(self, *ds: dict[str, Any]) -> None:
        """Facts, applied and made durable (fsync) before the caller acts on
        them."""
        with self._mu:
            for d in ds:
                self._apply(d)
                self._jf.write(_json.dumps(d) + "\n")
            self._jf.flush()
            _os.fsync(self._jf.fileno())

    # ---- the table of operations --------------------------------------------
    def begin(self, split: str, spec: str) -> None:
        """The split's write starts with this fingerprint (not complete)."""
        self._append({"op": "spec", "split": split, "spec": spec},
                     {"op": "incomplete", "split": split})

    def complete(self, split: str, samples: int) -> None:
        self._append({"op": "complete", "split": split, "samples": samples})

    def drop(self, split: str) -> None:
        """Forgets the split's record (its files must be gone)."""
        self._append({"op": "drop", "split": split})

    def entry(self, rel: str) -> Entry | str | None:
        """What is at rel: an Entry (the writer's), FOREIGN, or None."""
        e = self._owner.get(rel)
        if e is not None:
            return e
        return FOREIGN if _os.path.lexists(self.where(rel)) else None

    def intact(self, e: Entry) -> bool:
        """Whether the writer's file is still as written (cheap: size and
        the (inode, mtime) stamp; resume reads no data back)."""
        if e.pending:
            return False
        try:
            st = _os.stat(self.where(e.path))
        except OSError:
            return False
        return st.st_size == e.size and (st.st_ino, st.st_mtime_ns) == e.stamp

    def inside(self, rel: str) -> None:
        """Raises ValueError when rel's directory resolves outside out (a
        symbolic link inside out pointing elsewhere)."""
        d = _os.path.realpath(_os.path.dirname(self.where(rel)))
        if _os.path.commonpath([d, self.real]) != self.real:
            raise ValueError(f"write: {self.where(rel)} would be written outside {self.out} "
                             f"(its directory resolves to {d})")

    def placer(self) -> LocalPlacer:
        """What writes this store's files: picklable, so that a Ray task on
        another process (or node, over a filesystem they share) runs it."""
        return LocalPlacer(self.out)

    def intend(self, rel: str, split: str, fid: int, fld: str, packed: bool) -> str:
        """Journals that the file at rel (rel + '.zst' when packed) is about
        to be written (before any byte of it); returns its final name."""
        final = rel + ".zst" if packed else rel
        self.inside(rel)
        self._append({"op": "intent", "path": final, "split": split, "fid": fid,
                      "field": fld})
        return final

    def record(self, final: str, split: str, fid: int, fld: str, content: str, size: int,
               sha256: str) -> Entry:
        """Journals a file a placer wrote (its size and sha256 as the placer
        saw them), stamped with (inode, mtime) as this process sees it."""
        p = self.where(final)
        try:
            st = _os.stat(p)
        except FileNotFoundError:
            raise ValueError(f"write: {p} was written by a worker but is not there: with "
                             "Ray, a local out must be a filesystem every node mounts at the "
                             "same path (NFS...), or write to s3://") from None
        if st.st_size != size:
            raise ValueError(f"write: {p} holds {st.st_size} bytes, the worker that wrote "
                             f"it wrote {size}: another process changed it")
        self._append({"op": "file", "path": final, "split": split, "fid": fid, "field": fld,
                      "content": content, "size": size, "sha256": sha256,
                      "stamp": [st.st_ino, st.st_mtime_ns]})
        return self._owner[final]

    def put(self, rel: str, split: str, fid: int, fld: str, content: str, data: bytes,
            pack: Any) -> Entry:
        """Writes data (NPY bytes whose sha256 is `content`) at rel, or its
        packed form at rel + '.zst' when pack(path) is given, journaled
        before (intent) and after (the file's facts)."""
        final = self.intend(rel, split, fid, fld, pack is not None)
        size, digest = self.placer().place(rel, split, fid, fld, content, data, pack)
        return self.record(final, split, fid, fld, content, size, digest)

    def remove(self, e: Entry) -> None:
        """Removes a file of the writer's (and its leftovers: temporary
        files, the .npy of a packed one) and forgets it."""
        p = self.where(e.path)
        # A packed file's .npy twin is the writer's too (made after its intent).
        for q in (p, p[:-4]) if p.endswith(".npy.zst") else (p,):
            _remove_temps(q)
            try:
                _os.unlink(q)
            except FileNotFoundError:
                pass
        self._append({"op": "gone", "path": e.path})

    def tidy(self, rel: str, packed: bool) -> None:
        """Leftovers of an interrupted run at one file of this write: its
        temporary files, and the .npy whose packed twin is finished (ours: the
        journal has the twin)."""
        p = self.where(rel)
        _remove_temps(p)
        if packed and _os.path.exists(p) and _os.path.exists(p + ".zst"):
            _os.unlink(p)


class LocalPlacer:
    """Writes one file under a local `out`, atomically (write_atomic, then
    the packer, itself atomic): the part of LocalStore.put that touches
    only the file, so that a process without the journal (a Ray task) can
    run it and hand the facts back. A retried call writes the same bytes
    again under a new temporary name."""

    def __init__(self, out: str) -> None:
        self.out = out

    def place(self, rel: str, split: str, fid: int, fld: str, content: str, data: bytes,
              pack: Any) -> tuple[int, str]:
        """Writes data at rel (packed at rel + '.zst' by pack(path) when it is
        given); returns the final file's (size, sha256)."""
        p = _os.path.join(self.out, rel)
        write_atomic(p, data)
        if pack is None:
            return _os.stat(p).st_size, content
        pack(p)
        return _os.stat(p + ".zst").st_size, sha256_file(p + ".zst")


def _remove_temps(final: str) -> None:
    import glob as _glob
    d, base = _os.path.split(final)
    for t in _glob.glob(_os.path.join(_glob.escape(d or "."),
                                      "." + _glob.escape(base) + ".tmp-*")):
        try:
            _os.unlink(t)
        except FileNotFoundError:
            pass
