"""DataLoader habits (issue 24, item 4): batch[name] for a missing field
says which fields there are."""
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

BS = 4


def make(globs, **kw):
    kw.setdefault("output", "numpy")
    kw.setdefault("batch_size", BS)
    return npyload.Loader(globs, **kw)


# ---- 3. a missing field names the fields there are ----

def test_missing_field_keyerror_lists_fields(dataset):
    globs, _ = dataset
    b = next(iter(make(globs)))
    with pytest.raises(KeyError) as ei:
        b["image"]
    msg = str(ei.value)
    for name in ("'images'", "'labels'", "'mask'"):
        assert name in msg, msg
    assert "did you mean 'images'" in msg
    with pytest.raises(KeyError, match="'mask'") as ei:
        b["zzz"]
    assert "did you mean" not in str(ei.value)
    assert b.get("image") is None and "image" not in b
    assert b["images"].shape[0] == len(b.indices)
