#!/usr/bin/env python3
"""The slider-CAPTCHA detector's trainer on npyload: a small fully
convolutional network predicting the two piece heatmaps and their sub-pixel
offsets from the preprocessed images (the layout examples/captcha_preprocess.py
and ``npyload-gen --preset captcha`` write: images (2, H, W), heatmaps
(2, H/4, W/4), offsets (4, H/4, W/4)).

What the loader does for it, in its C workers:
  - normalise the images (mean/std per channel) into float32, channels-last;
  - a random horizontal flip (p = 0.5) shared by images, heatmaps and
    offsets, the offsets' horizontal components (channels 0 and 2) negated
    when a sample is mirrored (Transform(hflip_sign=...));
  - DDP's split by rank (torchrun sets RANK/WORLD_SIZE; torch.distributed
    is initialised here, and the loader takes its rank from it);
  - an exact resume: the checkpoint holds the loader's state_dict(), so a
    resumed run sees the same remaining batches with the same flips as an
    uninterrupted one (flips are a function of (seed, epoch, sample)).

    python examples/captcha_train.py --data DIR [--epochs 2] [--ckpt ck.pt]
    torchrun --standalone --nproc_per_node=2 examples/captcha_train.py --data DIR
    python examples/captcha_train.py --data DIR --ckpt ck.pt --resume

--stop-after N saves the checkpoint and exits after N steps (to test a
resume); --steps-log FILE writes one JSON line per step (epoch, step, the batch's
sample indices, which rows were flipped, the loss) on rank 0.
"""
from __future__ import annotations

import argparse
import glob
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import npyload

MEAN, STD = (0.5, 0.5), (0.25, 0.25)
SIGN = (-1.0, 1.0, -1.0, 1.0)  # offsets (du, dv) per piece: du flips sign


def fields(root: str) -> dict[str, list[str]]:
    def files(pattern: str) -> list[str]:
        found = sorted(glob.glob(os.path.join(root, pattern)))
        if not found:
            raise SystemExit(f"captcha_train: no {pattern} under {root}")
        return found
    return {"images": files("images/train/train_*.npy"),
            "heatmaps": files("labels/train/train_*_heatmaps.npy"),
            "offsets": files("labels/train/train_*_offsets.npy")}


class Detector(torch.nn.Module):
    """Two stride-2 convolutions down to the label grid, then a head of
    2 heatmap logits and 4 offsets per cell."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(2, width, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(width, width, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Conv2d(width, 6, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.head(self.body(x))
        return y[:, :2], y[:, 2:]


def loss_fn(hm_logit: torch.Tensor, off: torch.Tensor, hm: torch.Tensor,
            off_t: torch.Tensor) -> torch.Tensor:
    l_hm = F.binary_cross_entropy_with_logits(hm_logit.float(), hm)
    mask = (off_t != 0).float()
    l_off = (mask * (off.float() - off_t).abs()).sum() / mask.sum().clamp(min=1.0)
    return l_hm + l_off


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt", default=None, help="checkpoint file (saved each epoch)")
    ap.add_argument("--resume", action="store_true", help="start from --ckpt")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="save --ckpt and exit after this many steps")
    ap.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                    help="bfloat16 autocast (auto: on a CUDA device that has it)")
    ap.add_argument("--steps-log", default=None, help="JSON lines, one per step (rank 0)")
    a = ap.parse_args()

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    bf16 = a.bf16 == "on" or (a.bf16 == "auto" and cuda and torch.cuda.is_bf16_supported())

    torch.manual_seed(a.seed)
    net = Detector().to(device)
    net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    model: torch.nn.Module = (torch.nn.parallel.DistributedDataParallel(net)
                              if distributed else net)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)

    p_flip = 0.5
    loader = npyload.Loader(
        fields(a.data), batch_size=a.batch_size, shuffle=True, seed=a.seed, drop_last=True,
        num_workers=a.workers, device=device.type if not cuda else str(device),
        transforms={
            "images": npyload.Transform("float32", mean=MEAN, std=STD, channels_last=True,
                                        hflip=p_flip),
            "heatmaps": npyload.Transform(hflip=p_flip),
            "offsets": npyload.Transform(hflip=p_flip, hflip_sign=SIGN),
        })

    start_epoch, step, mid_epoch = 0, 0, False
    if a.resume:
        ck = torch.load(a.ckpt, map_location=device, weights_only=False)
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        loader.load_state_dict(ck["loader"])
        start_epoch, step, mid_epoch = ck["epoch"], ck["step"], ck["mid_epoch"]

    def save(epoch: int, mid: bool) -> None:
        if a.ckpt and rank == 0:
            torch.save({"model": net.state_dict(),
                        "opt": opt.state_dict(), "loader": loader.state_dict(),
                        "epoch": epoch, "step": step, "mid_epoch": mid}, a.ckpt)

    log = open(a.steps_log, "a") if a.steps_log and rank == 0 else None
    try:
        for epoch in range(start_epoch, a.epochs):
            if not (mid_epoch and epoch == start_epoch):
                loader.set_epoch(epoch)   # a resumed epoch continues where it stopped
            for b in loader:
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    hm_logit, off = model(b["images"])
                loss = loss_fn(hm_logit, off, b["heatmaps"], b["offsets"])
                opt.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                opt.step()
                step += 1
                if log:
                    log.write(json.dumps({
                        "epoch": epoch, "step": step,
                        "indices": [int(i) for i in b.indices],
                        "hflip": [bool(f) for f in b.augment["images"].hflip],
                        "loss": loss.item()}) + "\n")
                    log.flush()
                if a.stop_after is not None and step >= a.stop_after:
                    save(epoch, True)
                    return
            save(epoch + 1, False)
            if rank == 0:
                print(f"epoch {epoch}: step {step}, loss {loss.item():.4f}")
    finally:
        # Stop the loader's threads, then leave the process group together
        # (a rank exiting while another still talks to it can abort gloo).
        loader.close()
        if log:
            log.close()
        if distributed:
            dist.barrier()
            dist.destroy_process_group()

if __name__ == "__main__":
    main()
