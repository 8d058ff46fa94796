"""Turns a folder of slider-CAPTCHA images plus a JSON of gap/slider
positions into npyload's reference layout, computing the heatmaps and
offsets once so that training never recomputes them:

    images/{split}/{split}_{id:04d}.npy            float32 (S, 2, 256, 512)
        gray levels k/255 and a mask (1 on the image, 0 on the padding)
    labels/{split}/{split}_{id:04d}_heatmaps.npy   float32 (S, 2, 64, 128)
        gap, slider: a gaussian (sigma 1.5) cut to the 9x9 window around
        the peak cell, 1.0 at the peak cell
    labels/{split}/{split}_{id:04d}_offsets.npy    float32 (S, 4, 64, 128)
        gap du, dv, slider du, dv in [-0.5, 0.5) at the peak cell only

The JSON maps each image's file name to {"gap": [x, y], "slider": [x, y]}
in the image's pixels. Each image is scaled to fit 256 x 512 (aspect kept),
placed at the top left; positions are scaled alike, and a centre (x, y)
lands in heatmap cell (v, u) = (floor(y / 4), floor(x / 4)) with offsets
du = x / 4 - u - 0.5, dv = y / 4 - v - 0.5 (the grid's stride is 4).

    python3 examples/captcha_preprocess.py --images DIR --positions pos.json \\
        --out data [--split train] [--pack]
"""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

import npyload

F32 = npt.NDArray[np.float32]  # a float32 array of any shape
H, W, STRIDE, SIGMA, RADIUS = 256, 512, 4, 1.5, 4
HM_H, HM_W = H // STRIDE, W // STRIDE
_G = np.exp(-(np.arange(-RADIUS, RADIUS + 1)[:, None] ** 2 +
              np.arange(-RADIUS, RADIUS + 1)[None, :] ** 2) / (2 * SIGMA ** 2)).astype(np.float32)

LAYOUT = {"images": "images/{split}/{split}_{id:04d}.npy",
          "heatmaps": "labels/{split}/{split}_{id:04d}_heatmaps.npy",
          "offsets": "labels/{split}/{split}_{id:04d}_offsets.npy"}


def labels(points: Sequence[tuple[float, float]]) -> tuple[F32, F32]:
    """Heatmaps (2, 64, 128) and offsets (4, 64, 128) for [(x, y) gap, (x, y)
    slider] in the 256 x 512 image's pixels."""
    hm = np.zeros((2, HM_H, HM_W), np.float32)
    off = np.zeros((4, HM_H, HM_W), np.float32)
    for c, (x, y) in enumerate(points):
        gx, gy = x / STRIDE, y / STRIDE
        u = min(max(int(np.floor(gx)), 0), HM_W - 1)
        v = min(max(int(np.floor(gy)), 0), HM_H - 1)
        y0, y1 = max(v - RADIUS, 0), min(v + RADIUS + 1, HM_H)
        x0, x1 = max(u - RADIUS, 0), min(u + RADIUS + 1, HM_W)
        hm[c, y0:y1, x0:x1] = _G[y0 - v + RADIUS:y1 - v + RADIUS, x0 - u + RADIUS:x1 - u + RADIUS]
        off[2 * c, v, u] = gx - u - 0.5
        off[2 * c + 1, v, u] = gy - v - 0.5
    return hm, off


class Captchas:
    """A map-style Dataset over the images listed in the positions JSON."""

    def __init__(self, images: str, positions: str) -> None:
        with open(positions) as f:
            self.pos: dict[str, Any] = json.load(f)
        self.names = sorted(self.pos)
        self.root = images

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> dict[str, F32]:
        name = self.names[i]
        with Image.open(os.path.join(self.root, name)) as im:
            g = im.convert("L")
            scale = min(H / g.height, W / g.width)
            w, h = max(1, round(g.width * scale)), max(1, round(g.height * scale))
            a = np.asarray(g.resize((w, h), Image.Resampling.BILINEAR))
        img = np.zeros((2, H, W), np.float32)
        img[0, :h, :w] = a.astype(np.float32) / np.float32(255)
        img[1, :h, :w] = 1.0
        p = self.pos[name]
        hm, off = labels([(p["gap"][0] * scale, p["gap"][1] * scale),
                          (p["slider"][0] * scale, p["slider"][1] * scale)])
        return {"images": img, "heatmaps": hm, "offsets": off}


def main(argv: Sequence[str] | None = None) -> dict[str, list[str]]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--images", required=True)
    ap.add_argument("--positions", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--samples-per-file", type=int, default=64)
    ap.add_argument("--pack", action="store_true", help="pack the shards, images and "
                    "heatmaps narrowed (8-bit levels stored as float32)")
    a = ap.parse_args(argv)
    fields = npyload.write(Captchas(a.images, a.positions), a.out,
                           samples_per_file=a.samples_per_file, layout=LAYOUT, split=a.split,
                           narrow=a.pack)
    for k, v in fields.items():
        print(f"{k}: {len(v)} files")
    return fields


if __name__ == "__main__":
    main()
