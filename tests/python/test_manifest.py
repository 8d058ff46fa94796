"""Dataset manifests (issue 39): npyload.write writes SPLIT.manifest.json
last; Loader opens it without listing (the files it names, in order, even
when a glob would match others) and checks every file's size at start;
another format or a newer version is refused."""
import json

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")


def test_loader_opens_the_manifest_and_checks_sizes(tmp_path):
    a = {"x": np.arange(33, dtype=np.float32).reshape(11, 3), "y": np.arange(11)}
    f = npyload.write(a, tmp_path, samples_per_file=4, progress=False, pack=True)
    m = json.loads((tmp_path / "train.manifest.json").read_text())
    assert m["format"] == "npyload-manifest" and m["version"] == 1 and m["samples"] == 11
    assert [x["samples"] for x in m["fields"]["x"]["files"]] == [4, 4, 3]
    assert m["fields"]["x"]["shape"] == [3] and m["fields"]["x"]["dtype"] == "<f4"
    import hashlib
    for x, p in zip(m["fields"]["y"]["files"], f["y"]):
        body = open(p, "rb").read()
        assert x["size"] == len(body) and x["sha256"] == hashlib.sha256(body).hexdigest()
    # a stray file a glob would pick up is not in the manifest
    np.save(tmp_path / "x" / "train_0099.npy", np.zeros((2, 3), np.float32))
    L = npyload.Loader(str(tmp_path / "train.manifest.json"), batch_size=11, output="numpy")
    (b,) = list(L)
    order = np.argsort(b.indices)
    np.testing.assert_array_equal(b["x"][order], a["x"])
    np.testing.assert_array_equal(b["y"][order], a["y"])
    L.close()
    with open(f["x"][1], "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ValueError, match=r"x/train_0001.npy.zst holds \d+ bytes, the "
                                         r"manifest says \d+"):
        npyload.Loader(tmp_path / "train.manifest.json", batch_size=4)


def test_other_formats_and_newer_versions_are_refused(tmp_path):
    p = tmp_path / "m.json"
    for doc, why in (({"format": "other"}, "not an npyload manifest"),
                     ({"format": "npyload-manifest", "version": 2, "fields": {}},
                      "version 2"),
                     ({"format": "npyload-manifest", "version": 1,
                       "fields": {"x": {"files": [{"path": "../x.npy", "size": 1}]}}},
                      "relative path")):
        p.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=why):
            npyload.Loader(str(p), batch_size=1)


def test_a_write_that_changes_anything_removes_the_manifest_first(tmp_path):
    a = {"x": np.arange(8, dtype=np.int16)}
    npyload.write(a, tmp_path, samples_per_file=4, progress=False)
    assert (tmp_path / "train.manifest.json").exists()
    class Boom:
        def __len__(self):
            return 8
        def __getitem__(self, i):
            if i >= 4:
                raise RuntimeError("source failed")
            return {"x": a["x"][i]}
    with pytest.raises(RuntimeError):
        npyload.write(Boom(), tmp_path, samples_per_file=4, progress=False, overwrite=True,
                      num_workers=1)
    assert (tmp_path / "x" / "train_0000.npy").exists()   # file 0 was rewritten
    assert not (tmp_path / "train.manifest.json").exists()


def test_inspect_reads_a_manifest_and_checks_each_file(tmp_path):
    """npyload.inspect(manifest) == inspect_manifest: the manifest's facts
    with each file's header (independent truth: numpy's reading of each
    file); a file whose size, samples, shape or sha256 differ is named."""
    a = {"x": np.arange(33, dtype=np.float32).reshape(11, 3),
         "c": (np.arange(11 * 2) % 3).astype(np.float32).reshape(11, 2)}
    f = npyload.write(a, tmp_path, samples_per_file=4, progress=False)
    npyload.write(a, tmp_path / "n", samples_per_file=4, progress=False, narrow=True)
    m = str(tmp_path / "train.manifest.json")
    d = npyload.inspect(m)
    assert d == npyload.inspect_manifest(m, verify=True)
    assert d["samples"] == 11 and list(d["fields"]) == ["x", "c"]
    for x, p in zip(d["fields"]["x"]["files"], f["x"]):
        arr = np.load(p)
        assert x["location"] == p and x["samples"] == len(arr)
        assert x["header"]["shape"] == arr.shape and x["header"]["descr"] == arr.dtype.str
    n = npyload.inspect_manifest(tmp_path / "n" / "train.manifest.json", verify=True)
    assert n["fields"]["c"]["files"][0]["header"]["value_descr"] == "<f4"   # narrowed
    # the same size, other bytes: only verify=True sees it
    body = bytearray(open(f["x"][1], "rb").read())
    body[-1] ^= 1
    open(f["x"][1], "wb").write(bytes(body))
    npyload.inspect(m)
    with pytest.raises(ValueError, match=r"x/train_0001.npy: its sha256 differs"):
        npyload.inspect(m, verify=True)
    # another file of another sample count in a file's place
    np.save(f["c"][2], np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"c/train_0002.npy: (bytes|samples) \d+, the "
                                         r"manifest says \d+"):
        npyload.inspect_manifest(m)
