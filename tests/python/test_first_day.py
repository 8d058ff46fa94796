"""A PyTorch user's first day (issue 40): DataLoader keywords answered,
the silent mistakes said at construction, and npyload.load reading every
form npyload writes.

Independent truths: numpy's own reading of the .npy each shard came from
(np.load), the DataLoader keyword list of torch's signature when torch is
importable."""
import inspect
import os
import shutil
import warnings

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

N = 24


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("firstday")
    rng = np.random.default_rng(3)
    np.save(d / "img.npy", rng.integers(0, 256, (N, 2, 8, 16), dtype=np.uint8))
    np.save(d / "hm.npy", rng.random((N, 2, 4, 8), dtype=np.float32))
    np.save(d / "off.npy", rng.random((N, 4, 4, 8), dtype=np.float32) - 0.5)
    np.save(d / "cls.npy", rng.integers(0, 5, (N,), dtype=np.int64))
    return d


def fields(d, *names):
    return {n: str(d / f"{n}.npy") for n in names}


# ---- item 5: DataLoader keywords ----

EQUIVALENT = {
    "prefetch_factor": "prefetch=",
    "collate_fn": "transform=fn",
    "sampler": "shuffle=",
    "worker_init_fn": "threads",
}


@pytest.mark.parametrize("kw,value", [("prefetch_factor", 2), ("collate_fn", lambda b: b),
                                      ("sampler", object()), ("worker_init_fn", lambda i: 0)])
def test_dataloader_keyword_names_the_equivalent(data, kw, value):
    with pytest.raises(TypeError) as e:
        npyload.Loader(fields(data, "img"), batch_size=4, **{kw: value})
    msg = str(e.value)
    assert f"no {kw}=" in msg and "DataLoader" in msg and EQUIVALENT[kw] in msg, msg


@pytest.mark.parametrize("value", [True, False])
def test_persistent_workers_is_accepted(data, value):
    """Workers are threads that live from the first iter() to close():
    the batches are those of a loader without the keyword."""
    with npyload.Loader(fields(data, "img"), batch_size=4, output="numpy",
                        persistent_workers=value) as a, \
            npyload.Loader(fields(data, "img"), batch_size=4, output="numpy") as b:
        for _ in range(2):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x["img"], y["img"])


def test_pin_memory_is_accepted(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA it warns once (test_ergonomics)
        with npyload.Loader(fields(data, "img"), batch_size=4, output="numpy",
                            pin_memory=True) as ld:
            assert sum(1 for _ in ld) == N // 4


def test_persistent_workers_must_be_a_bool_and_typos_still_fail(data):
    with pytest.raises(TypeError, match="persistent_workers must be a bool"):
        npyload.Loader(fields(data, "img"), batch_size=4, persistent_workers="yes")
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_worker'"):
        npyload.Loader(fields(data, "img"), batch_size=4, num_worker=2)


def test_every_dataloader_keyword_is_answered(data):
    """Each keyword of torch's DataLoader is either a Loader parameter, accepted,
    or refused with a TypeError that names what to use (never Python's bare
    'unexpected keyword argument')."""
    torch = pytest.importorskip("torch", reason="torch is not installed (the DataLoader "
                                                 "signature is the truth here)")
    params = set(inspect.signature(torch.utils.data.DataLoader).parameters) - {"self", "dataset"}
    own = set(inspect.signature(npyload.Loader).parameters)
    for kw in sorted(params - own):
        try:
            npyload.Loader(fields(data, "img"), batch_size=4, **{kw: True})
        except TypeError as e:
            assert "unexpected keyword" not in str(e), (kw, str(e))
        except Exception:
            pass


# ---- item 6: the silent mistakes ----

def flip(p=0.5, **kw):
    return npyload.Transform(hflip=p, **kw)


def test_flip_on_some_spatial_fields_warns_naming_them(data):
    with pytest.warns(npyload.FlipMismatchWarning) as w:
        npyload.Loader(fields(data, "img", "hm", "off", "cls"), batch_size=4,
                       transforms={"img": flip(), "hm": flip()})
    msg = str(w[0].message)
    assert "img (hflip=0.5)" in msg and "hm (hflip=0.5)" in msg and "off (hflip=0.0)" in msg
    assert "cls" not in msg.split("but not")[1].split(",")[0]  # 1-D labels have no axes
    assert w[0].filename == __file__  # points at the user's line


def test_flip_on_every_spatial_field_is_quiet_and_the_opt_out_is_explicit(data):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npyload.Loader(fields(data, "img", "hm", "off", "cls"), batch_size=4,
                       transforms={"img": flip(), "hm": flip(),
                                   "off": flip(hflip_sign=[-1, 1, -1, 1])})
        # Intended: one category, named, silences exactly this warning.
        warnings.filterwarnings("ignore", category=npyload.FlipMismatchWarning)
        npyload.Loader(fields(data, "img", "hm"), batch_size=4, transforms={"img": flip()})


def test_different_flip_probabilities_warn(data):
    with pytest.warns(npyload.FlipMismatchWarning, match=r"hm \(hflip=0.25\)"):
        npyload.Loader(fields(data, "img", "hm"), batch_size=4,
                       transforms={"img": flip(0.5), "hm": flip(0.25)})


def test_flip_sign_without_flip_warns(data):
    with pytest.warns(UserWarning, match=r"transforms\['off'\] has hflip_sign but no hflip"):
        npyload.Loader(fields(data, "off"), batch_size=4,
                       transforms={"off": npyload.Transform(hflip_sign=[-1, 1, -1, 1])})


def test_an_epoch_of_zero_batches_warns(data):
    with pytest.warns(UserWarning, match=r"an epoch has no batch \(batch_size=32 is more "
                                         r"than the 24 samples"):
        ld = npyload.Loader(fields(data, "img"), batch_size=32, drop_last=True)
    assert len(ld) == 0 and sum(1 for _ in ld) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npyload.Loader(fields(data, "img"), batch_size=32)  # one short batch: fine


# ---- item 8: npyload.load reads every form ----

@pytest.mark.parametrize("form", ["npy", "zst", "narrow_stored", "narrow_zst"])
def test_load_reads_every_form_npyload_writes(data, tmp_path, form):
    src = tmp_path / "img.npy"
    truth = np.load(data / "img.npy").astype(np.float32) / 255  # 256 distinct values at most
    np.save(src, truth)
    if form == "npy":
        path = src
    else:
        kw = {"narrow": form.startswith("narrow"), "store": form == "narrow_stored"}
        res = npyload.pack([src], out=str(tmp_path / "out"), **kw)
        path = res[0]["out"] if isinstance(res[0], dict) else res[0].out
    got = npyload.load(path)
    assert got.dtype == truth.dtype and got.shape == truth.shape
    assert got.tobytes() == truth.tobytes()  # bit for bit
    if form != "npy":
        got2 = npyload.load(path, mmap=False)
        assert got2.tobytes() == truth.tobytes()


def test_np_load_cannot_and_the_docs_say_what_to_use(data, tmp_path):
    src = tmp_path / "a.npy"
    shutil.copy(data / "hm.npy", src)
    npyload.pack([src])
    with pytest.raises(ValueError, match="pickled"):
        np.load(str(src) + ".zst")
    page = (__import__("pathlib").Path(__file__).resolve().parents[2] / "docs" /
            "writing.md").read_text()
    assert "npyload.load" in page and ".npy.zst" in page and "np.load" in page


# ---- item 10: docs that match the API ----

DOCS = __import__("pathlib").Path(__file__).resolve().parents[2] / "docs"


def test_docs_name_the_python_remote_keys_in_seconds():
    from npyload import _remote
    page = " ".join((DOCS / "remote.md").read_text().split())
    for key in ("timeout", "retry_base"):
        assert key in _remote._KEYS
        assert f"`{key}` (seconds in Python" in page, key


def test_bench_options_are_documented_beyond_help():
    page = (DOCS / "tools.md").read_text()
    for opt in ("--compute-ms", "--transform", "--seed", "--drop-last"):
        assert f"`{opt}" in page, opt


def test_write_memory_bound_is_the_same_in_docs_and_docstring():
    import re
    doc = " ".join(npyload.write.__doc__.split())
    m = re.search(r"at most ``num_workers`` ?(\+ ?\d)? files per field", doc)
    assert m, doc
    page = " ".join((DOCS / "writing.md").read_text().split())
    bound = m.group(1) or ""
    assert f"at most `num_workers`{(' ' + bound) if bound else ''} files per field" in page
