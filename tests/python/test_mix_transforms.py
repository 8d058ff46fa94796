"""Loader(sources=..., transforms=...) with a transform per source: each
source's rows go through that source's own transform. Every delivered row
equals numpy's rendering (test_augment's augment_row and transform_row) of
the stored row under its source's transform, with the augmentation
decisions of the formula written in npyload.h drawn by the row's source
(seed XOR mix64(k * G), the source's pass, the index within the source:
mix_reference's Mixture gives the three); what cannot work is refused
naming the source and the field."""
import numpy as np
import pytest

import npyload
from mix_reference import Mixture, tag_seed
from test_augment import augment_row, decide, transform_row
from test_order_vs_torch import FULL

TAG = 1000  # x of source k, sample i: k * TAG + i
SIZES = [30, 11]
SEED = 5


def make(root, sizes=SIZES, dtype=np.int32):
    """Source k: x (int64) = k * TAG + i; y = a (2, 3) row whose six values
    differ (flips show), 10 * x + 0 .. 5, in two files."""
    sources, files, ys = {}, [], []
    for k, n in enumerate(sizes):
        d = root / f"s{k}"
        d.mkdir(parents=True, exist_ok=True)
        x = k * TAG + np.arange(n, dtype=np.int64)
        y = (10 * x[:, None] + np.arange(6)).reshape(n, 2, 3).astype(dtype)
        cut = n // 2
        for j, sl in enumerate((slice(0, cut), slice(cut, n))):
            np.save(d / f"x_{j}.npy", x[sl])
            np.save(d / f"y_{j}.npy", y[sl])
        sources[f"src{k}"] = {"x": str(d / "x_*.npy"), "y": str(d / "y_*.npy")}
        files.append([cut, n - cut])
        ys.append(y)
    return sources, files, ys


def want_row(stored, t, seed, k, q, i):
    """numpy's reading of row i of source k in its pass q under t (None:
    the stored row), and its decisions."""
    if t is None:
        return stored, (False, False, 0, 0)
    hf, vf, top, left = decide(tag_seed(seed, k), q, i, t, stored.shape[-2:])
    return transform_row(augment_row(stored, t, hf, vf, top, left), t), (hf, vf, top, left)


def check_epochs(sources, files, ys, transforms, per_source, epochs=2, workers=2):
    """Loads `epochs` epochs and checks every row of y against numpy with
    per_source[k] (source k's transform, or None); returns the decisions
    seen per source."""
    m = Mixture(SIZES, [0.5, 0.5], shuffle=FULL, seed=SEED, files=files)
    seqs, _ = m.run(epochs)
    seen = {0: set(), 1: set()}
    with npyload.Loader(sources=sources, weights={"src0": 0.5, "src1": 0.5}, batch_size=4,
                        shuffle=True, seed=SEED, num_workers=workers, output="numpy",
                        transforms=transforms) as ld:
        for e in range(epochs):
            ld.set_epoch(e)
            rows = []
            for b in ld:
                src, idx = np.asarray(b.source), np.asarray(b.indices)
                assert np.array_equal(np.asarray(b["x"]), src * TAG + idx)
                y = np.asarray(b["y"])
                aug = b.augment.get("y")
                for r, (k, i) in enumerate(zip(src.tolist(), idx.tolist())):
                    q = seqs[e][len(rows)][2]
                    assert seqs[e][len(rows)][:2] == (k, i)
                    want, dec = want_row(ys[k][i], per_source[k], SEED, k, q, i)
                    assert y[r].dtype == want.dtype and y[r].shape == want.shape, (k, i)
                    np.testing.assert_array_equal(y[r], want, err_msg=f"source {k} row {i}")
                    if aug is not None:
                        assert (bool(aug.hflip[r]), bool(aug.vflip[r]), int(aug.top[r]),
                                int(aug.left[r])) == dec, (k, i)
                    seen[k].add(dec)
                    rows.append((k, i))
            assert len(rows) == len(seqs[e])
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_each_source_its_own_transform(tmp_path, workers):
    """src0 scaled and flipped, src1 normalised, both float32: each row as
    numpy gives it under its own source's transform, and the decisions
    exposed (batch.augment) are those of the row's source."""
    sources, files, ys = make(tmp_path)
    t0 = npyload.Transform("float32", scale=0.5, hflip=0.5, vflip=0.5)
    t1 = npyload.Transform("float32", scale=2.0, mean=1.0, std=4.0)
    seen = check_epochs(sources, files, ys, {"src0": {"y": t0}, "src1": {"y": t1}},
                        [t0, t1], workers=workers)
    assert len(seen[0]) == 4  # src0 flipped every way
    assert seen[1] == {(False, False, 0, 0)}  # src1 never


def test_a_field_transform_with_one_source_override(tmp_path):
    """{field: T} for every source and {source: {field: T'}}: the source
    named takes T', the others T."""
    sources, files, ys = make(tmp_path)
    shared = npyload.Transform("float32", scale=0.25)
    own = npyload.Transform("float32", scale=3.0, hflip=0.5, crop=(2, 2), pad=1)
    shared_crop = npyload.Transform("float32", scale=0.25, crop=(2, 2), pad=1)
    seen = check_epochs(sources, files, ys, {"y": shared_crop, "src1": {"y": own}},
                        [shared_crop, own])
    assert any(d[0] for d in seen[1]) and not any(d[0] for d in seen[0])
    with pytest.raises(npyload.NpyloadError, match="src1") as e:
        npyload.Loader(sources=sources, batch_size=4, output="numpy",
                       transforms={"y": shared, "src1": {"y": own}})
    # the message names the field and what each source delivers
    assert "'y'" in str(e.value) and "(2, 3)" in str(e.value) and "(2, 2)" in str(e.value)


def test_a_source_left_out_delivers_its_stored_rows(tmp_path):
    """Only src0 is augmented (stored dtype kept): src1's rows are as
    stored, their decisions all zero."""
    sources, files, ys = make(tmp_path)
    t0 = npyload.Transform(hflip=0.5, vflip=0.5)
    seen = check_epochs(sources, files, ys, {"src0": {"y": t0}}, [t0, None])
    assert len(seen[0]) == 4 and seen[1] == {(False, False, 0, 0)}


def test_outputs_that_differ_are_refused_naming_both_sources(tmp_path):
    sources, _, _ = make(tmp_path)
    with pytest.raises(npyload.NpyloadError) as e:
        npyload.Loader(sources=sources, batch_size=4, output="numpy",
                       transforms={"src0": {"y": npyload.Transform("float32")}})
    msg = str(e.value)
    assert "'y'" in msg and "src0" in msg and "src1" in msg, msg
    assert "<f4" in msg and "<i4" in msg, msg


@pytest.mark.parametrize("transforms, exc, msg", [
    ({"nope": {"y": npyload.Transform("float32")}}, ValueError,
     r"'nope' is neither a field \(x, y\) nor a source \(src0, src1\)"),
    ({"src0": npyload.Transform("float32")}, TypeError,
     r"transforms\['src0'\]: a source's transforms are a mapping"),
    ({"src0": {"z": npyload.Transform("float32")}}, ValueError,
     r"source 'src0': transforms: no field named 'z'"),
    ({"src0": {"y": 2.0}}, TypeError, r"source 'src0': transforms\['y'\] must be"),
])
def test_unknown_sources_and_fields_are_clear_errors(tmp_path, transforms, exc, msg):
    sources, _, _ = make(tmp_path)
    with pytest.raises(exc, match=msg):
        npyload.Loader(sources=sources, batch_size=4, output="numpy", transforms=transforms)


def test_engine_and_stream_digest(tmp_path):
    """field_engines() names the host engine; a per-source augmentation
    changes the digest (the decisions are in it), the same transform
    twice gives the same digest."""
    sources, _, _ = make(tmp_path)
    t = npyload.Transform("float32", hflip=0.5)
    digests = []
    for tr in ({"src0": {"y": t}}, {"src0": {"y": t}}, {"src1": {"y": t}}):
        with npyload.Loader(sources=sources, batch_size=4, shuffle=True, seed=SEED,
                            output="numpy", transforms={"y": npyload.Transform("float32"),
                                                        **tr}) as ld:
            assert ld.field_engines()["y"][0] == "host"
            for _ in ld:
                pass
            digests.append(ld.stats()["digest"])
    assert digests[0] == digests[1] != digests[2]
