"""The console scripts npyload-bench, npyload-gen, npyload-inspect and
npyload-pack of a pip install: each replaces itself (``os.execv``) with the C
program of the same name in ``npyload/_bin`` (tools/CMakeLists.txt), so exit
status, signals and standard streams are the program's own.

The programs live inside the package, not in the wheel's scripts folder,
because only there do they have a fixed place relative to the libraries a
repaired wheel bundles (``npyload.libs``, reached through the rpath
``$ORIGIN/../../npyload.libs`` that auditwheel sets), whatever the install
scheme (venv, ``--user``, ``--target``)."""
from __future__ import annotations

import os
import sys
from typing import NoReturn

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def _exec(name: str) -> NoReturn:
    path = os.path.join(_BIN, name)
    try:
        os.execv(path, [name, *sys.argv[1:]])
    except OSError as e:
        sys.stderr.write(f"{name}: cannot run {path}: {e.strerror} (reinstall npyload)\n")
        sys.exit(127)


def bench() -> NoReturn:
    """``npyload-bench``: measure and recommend num_workers and prefetch."""
    _exec("npyload-bench")


def gen() -> NoReturn:
    """``npyload-gen``: write the reference layout or a generic dataset."""
    _exec("npyload-gen")


def inspect() -> NoReturn:
    """``npyload-inspect``: print the header facts of .npy / .npy.zst files."""
    _exec("npyload-inspect")


def pack() -> NoReturn:
    """``npyload-pack``: write .npy.zst seekable shards."""
    _exec("npyload-pack")
