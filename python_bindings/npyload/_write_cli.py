"""npyload-write: the common cases of npyload.write from a shell: a folder
of images (decoded with Pillow), or a module:function returning a Dataset."""
import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._write import write

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
    if a.images:
        if not a.size:
            ap.error("--images needs --size H,W")
        source: Any = ImageFolder(a.images, a.size, a.dtype, a.mode)
    else:
        mod, sep, fn = a.source.partition(":")
        if not sep:
            ap.error(f"--source wants MODULE:FUNCTION, got {a.source!r}")
        sys.path.insert(0, os.getcwd())
        source = getattr(importlib.import_module(mod), fn)()
    try:
        fields = write(source, a.out, samples_per_file=a.samples_per_file,
                       layout=_layout(a.layout), split=a.split, num_workers=a.workers,
                       pack=a.pack, narrow=a.narrow, overwrite=a.overwrite,
                       progress=not a.quiet)
    except (ValueError, TypeError, OSError) as e:
        print(f"npyload-write: {e}", file=sys.stderr)
        return 1
    if not a.quiet:
        for k, v in fields.items():
            print(f"{k}: {len(v)} files, {v[0]} .. {v[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
