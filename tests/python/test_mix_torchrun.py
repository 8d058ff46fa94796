"""A mixture (Loader(sources=...)) under torchrun: real processes, gloo on
CPU. Two ranks read part of epoch 0, changing the weights mid-epoch after
the same number of batches on every rank; rank 0's state resumes three
ranks, which read the rest of epoch 0 and epoch 1. Checked against the
independent truths: mix_reference.py's reading of the documented order
(with the same change at the same global position) and torch's
DistributedSampler's split of what is left of the epoch (ddp_checks).

Skipped visibly without torch or torch.distributed."""
import collections
import os
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the torchrun tests need it")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
import ddp_checks  # noqa: E402
from ddp_checks import sampler_split  # noqa: E402
from mix_reference import Mixture  # noqa: E402
from test_order_vs_torch import FULL  # noqa: E402

SIZES = [40, 9]  # source 1 cycles within an epoch
TAG = 1000
BS = 4
SEED = 3
W0 = {"src0": 0.5, "src1": 0.5}
W1 = {"src0": 0.25, "src1": 0.75}  # from batch CHANGE of epoch 0 on
CHANGE, STOP = 2, 4                # batches per rank before the change, the save
TIMEOUT = 240

WORKER = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    import torch.distributed as dist
    import npyload
    from ddp_checks import end_of_epoch, write_out

    cfg = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = npyload.Loader(sources=cfg["sources"], weights=cfg["w0"], batch_size=cfg["bs"],
                            shuffle=True, seed=cfg["seed"], num_workers=2, output="numpy")
    if cfg.get("resume"):
        with open(cfg["resume"]) as f:
            loader.load_state_dict(json.load(f))
        loader.set_weights(cfg["w1"])  # the weights in force at the save: no change
    out = []
    for epoch in cfg["epochs"]:
        if not cfg.get("resume") or epoch != cfg["epochs"][0]:
            loader.set_epoch(epoch)
        rows, nb = [], 0
        for b in loader:
            src, idx = np.asarray(b.source), np.asarray(b.indices)
            assert (np.asarray(b["x"]) == src * cfg["tag"] + idx).all(), "bytes"
            rows += list(zip(src.tolist(), idx.tolist()))
            nb += 1
            if cfg.get("change") and epoch == 0 and nb == cfg["change"]:
                loader.set_weights(cfg["w1"])
            if cfg.get("stop") and nb == cfg["stop"]:
                break
        out.append(end_of_epoch(loader, {"rank": rank, "rows": rows, "batches": nb,
                                         "len": len(loader)}, cfg.get("stop") and cfg["save"]))
        if cfg.get("stop"):
            break
    write_out(out, cfg["out"])
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixddp")
    sources, files = {}, []
    for k, n in enumerate(SIZES):
        x = k * TAG + np.arange(n, dtype=np.int64)
        cut = n // 2
        np.save(root / f"s{k}_x_0.npy", x[:cut])
        np.save(root / f"s{k}_x_1.npy", x[cut:])
        sources[f"src{k}"] = {"x": str(root / f"s{k}_x_*.npy")}
        files.append([cut, n - cut])
    script = root / "worker.py"
    script.write_text(WORKER)
    return {"sources": sources, "files": files, "script": str(script), "root": root}


def torchrun(data, nproc, cfg, tag):
    cfg = dict(cfg, sources=data["sources"], bs=BS, seed=SEED, tag=TAG, w0=W0, w1=W1,
               out=str(data["root"] / f"out_{tag}.json"))
    out = ddp_checks.torchrun(data["script"], nproc, cfg, TIMEOUT)
    return [sorted(ranks, key=lambda r: r["rank"]) for ranks in out]


def test_world_2_to_3_with_a_mid_epoch_weight_change(data):
    save = str(data["root"] / "state.json")
    before = torchrun(data, 2, {"epochs": [0], "change": CHANGE, "stop": STOP, "save": save},
                      "before")[0]
    after = torchrun(data, 3, {"epochs": [0, 1], "resume": save}, "after")

    # The truth: the change takes effect at the global position the two
    # ranks had reached (CHANGE batches each), then the weights stay.
    m = Mixture(SIZES, [W0["src0"], W0["src1"]], shuffle=FULL, seed=SEED, files=data["files"])
    m.set_weights(0, CHANGE * BS * 2, [W1["src0"], W1["src1"]])
    seqs, _ = m.run(2)
    epoch0, epoch1 = ([(k, i) for k, i, _ in s] for s in seqs)

    # Before the save: rank r took positions r, r + 2, ... (nothing padded yet).
    saved = STOP * BS * 2
    for r in before:
        assert [tuple(x) for x in r["rows"]] == epoch0[r["rank"]:saved:2], r["rank"]
    # After: the rest of epoch 0 split over three ranks as DistributedSampler
    # splits it, equal batch counts; then epoch 1's normal split.
    rest = epoch0[saved:]
    assert len({r["batches"] for r in after[0]}) == 1, "unequal batch counts after resume"
    for r in after[0]:
        assert [tuple(x) for x in r["rows"]] == sampler_split(rest, 3, r["rank"]), r["rank"]
    for r in after[1]:
        assert [tuple(x) for x in r["rows"]] == sampler_split(epoch1, 3, r["rank"]), r["rank"]
        assert r["batches"] == r["len"]
    # Nothing lost, nothing repeated but the new split's padding.
    delivered = collections.Counter(tuple(x) for ranks in (before, after[0])
                                    for r in ranks for x in r["rows"])
    want = collections.Counter(epoch0)
    assert not want - delivered, "rows lost across the resume"
    assert sum((delivered - want).values()) <= 2, "repeats beyond the padding"
    # The change mattered: without it the epoch's rows after it differ.
    plain = Mixture(SIZES, [W0["src0"], W0["src1"]], shuffle=FULL, seed=SEED,
                    files=data["files"]).run(1)[0][0]
    assert [(k, i) for k, i, _ in plain][saved:] != rest
