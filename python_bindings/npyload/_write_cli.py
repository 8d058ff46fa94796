"""npyload-write: the common cases of npyload.write from a shell: a folder
of images (decoded with Pillow), or a module:function returning a Dataset."""
import argparse
import importlib
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from ._write import _Report, _write

_IMAGE_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif")


class ImageFolder:
    """Images under `root`, sorted by path: {"images": (C, H, W) array}, plus
    {"labels": int64} when the images sit in class subfolders (the
    torchvision ImageFolder convention: label = the subfolder's index in
    sorted order). Decoded and resized with Pillow (bilinear)."""

    def __init__(self, root: str, size: tuple[int, int], dtype: str = "uint8",
                 mode: str = "RGB") -> None:
        import numpy as np
        from PIL import Image  # Pillow: maintained, libjpeg-turbo/libpng/libwebp behind it
        self._np, self._Image = np, Image
        self.size, self.dtype, self.mode = size, dtype, mode
        self.paths = sorted(
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
            if f.lower().endswith(_IMAGE_EXT))
        if not self.paths:
            raise ValueError(f"npyload-write: no images ({', '.join(_IMAGE_EXT)}) under {root}")
        classes = sorted({os.path.relpath(os.path.dirname(p), root) for p in self.paths})
        self.labels: list[int] | None = None
        if classes != ["."]:
            index = {c: i for i, c in enumerate(classes)}
            self.labels = [index[os.path.relpath(os.path.dirname(p), root)] for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        np = self._np
        h, w = self.size
        with self._Image.open(self.paths[i]) as f:
            im = f.convert(self.mode)
            if im.size != (w, h):
                im = im.resize((w, h), self._Image.Resampling.BILINEAR)
            a = np.asarray(im)
        a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)  # (C, H, W)
        a = np.ascontiguousarray(a)
        if self.dtype == "float32":
            a = a.astype(np.float32) / np.float32(255)
        s = {"images": a}
        if self.labels is not None:
            s["labels"] = np.int64(self.labels[i])
        return s


def _size(s: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in s.split(","))
        if h > 0 and w > 0:
            return h, w
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--size wants H,W (two positive integers), got {s!r}")


def _layout(items: list[str] | None) -> dict[str, str] | None:
    out = {}
    for it in items or []:
        field, sep, tmpl = it.partition("=")
        if not sep or not field or not tmpl:
            raise SystemExit(f"npyload-write: --layout wants FIELD=TEMPLATE, got {it!r}")
        out[field] = tmpl
    return out or None


def _program() -> list[str]:
    """How this program was started, as a command to type: npyload-write
    when that name finds it, else its path, else python -m."""
    me = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(me) != "npyload-write":
        return [sys.executable, "-m", "npyload._write_cli"]
    found = shutil.which("npyload-write")
    return ["npyload-write"] if found and os.path.samefile(found, me) else [me]


def _resume_command(a: argparse.Namespace, changed: bool) -> str:
    """The command that resumes this run (the same write; absolute paths;
    --overwrite only while the run had changed nothing: after that it would
    start over)."""
    cmd = _program()
    cmd += ["--images", os.path.abspath(a.images)] if a.images else ["--source", a.source]
    cmd += ["--out", a.out if "://" in a.out else os.path.abspath(a.out)]
    if a.size:
        cmd += ["--size", f"{a.size[0]},{a.size[1]}"]
    for flag, value, default in (("--dtype", a.dtype, "uint8"), ("--mode", a.mode, "RGB"),
                                 ("--samples-per-file", a.samples_per_file, 64),
                                 ("--split", a.split, "train"), ("--workers", a.workers, None)):
        if value != default:
            cmd += [flag, str(value)]
    for item in a.layout or []:
        cmd += ["--layout", item]
    cmd += [f"--{f}" for f in ("pack", "narrow", "quiet") if getattr(a, f)]
    if a.overwrite and not changed:
        cmd.append("--overwrite")
    line = shlex.join(cmd)
    # --source imports its module from the current directory.
    return f"cd {shlex.quote(os.getcwd())} && {line}" if a.source else line


def _interrupted(a: argparse.Namespace, report: _Report) -> str:
    """The one line an interrupted run ends with."""
    cmd = _resume_command(a, report.changed())
    if report.plan is None:
        return f"npyload-write: interrupted before writing; to start again: {cmd}"
    of = f" of {report.nfiles}" if report.nfiles is not None else ""
    return (f"npyload-write: interrupted: {report.finished()}{of} files are finished in "
            f"{a.out}, and a resumed run keeps them; to resume: {cmd}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="npyload-write",
        description="Write NPY shards that npyload.Loader reads, from a folder of images "
                    "or from a module:function returning a Dataset (npyload.write).")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", metavar="DIR", help="a folder of images (class "
                     "subfolders give a 'labels' field)")
    src.add_argument("--source", metavar="MODULE:FUNCTION", help="a function returning "
                     "a map-style Dataset, an iterable of dicts or a dict of arrays")
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--size", type=_size, metavar="H,W", help="resize images to H x W "
                    "(required with --images)")
    ap.add_argument("--dtype", choices=("uint8", "float32"), default="uint8",
                    help="images as uint8 (default) or float32 in [0, 1] (k/255)")
    ap.add_argument("--mode", choices=("RGB", "L"), default="RGB",
                    help="RGB (3 channels, default) or L (gray, 1 channel)")
    ap.add_argument("--samples-per-file", type=int, default=64)
    ap.add_argument("--split", default="train")
    ap.add_argument("--workers", type=int, default=None, help="threads (default: cores)")
    ap.add_argument("--layout", action="append", metavar="FIELD=TEMPLATE",
                    help='e.g. images="images/{split}/{split}_{id:04d}.npy" (repeatable)')
    ap.add_argument("--pack", action="store_true", help="pack each file (.npy.zst)")
    ap.add_argument("--narrow", action="store_true", help="pack with lossless narrowing "
                    "where the data allow (implies --pack)")
    ap.add_argument("--overwrite", action="store_true", help="replace the split's previous "
                    "write (default: resume: keep the files an interrupted run of the same "
                    "command finished when their recorded checksums equal the new data's; "
                    "other data are refused)")
    ap.add_argument("--quiet", action="store_true", help="no progress, no summary")
    a = ap.parse_args(argv)
    if a.images and not a.size:
        ap.error("--images needs --size H,W")
    if a.source and ":" not in a.source:
        ap.error(f"--source wants MODULE:FUNCTION, got {a.source!r}")
    report = _Report()
    try:
        if a.images:
            source: Any = ImageFolder(a.images, a.size, a.dtype, a.mode)
        else:
            mod, _, fn = a.source.partition(":")
            sys.path.insert(0, os.getcwd())
            source = getattr(importlib.import_module(mod), fn)()
        fields = _write(report, source, a.out, samples_per_file=a.samples_per_file,
                        layout=_layout(a.layout), split=a.split, num_workers=a.workers,
                        pack=a.pack, narrow=a.narrow, overwrite=a.overwrite,
                        progress=not a.quiet, remote=None)
    except KeyboardInterrupt:
        # Ctrl-C: every finished file is journaled; one line says how to go on.
        print(_interrupted(a, report), file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError) as e:
        print(f"npyload-write: {e}", file=sys.stderr)
        return 1
    if not a.quiet:
        for k, v in fields.items():
            print(f"{k}: {len(v)} files, {v[0]} .. {v[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
