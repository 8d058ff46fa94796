"""The writer's property (issue 35): random sequences of writes over one
directory (different data, splits, layouts with and without {split},
overwrite, shorter and longer reruns, dict and iterable sources, writes
killed with SIGKILL at random moments) never leave a glob of the layout
loading anything but the last successful write's data; a refused write
changes nothing; a killed one leaves only complete files; nothing outside
`out` and no file the writer did not make is ever touched.

hypothesis draws the sequences (a bounded number of examples: CI-sized);
numpy's reading of the files is the truth."""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (it is in "
                                 "the test extra: pip install hypothesis)")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from conftest import file_digests  # noqa: E402

LAYOUTS = {"split": "{field}/{split}_{id:03d}.npy", "flat": "{field}_{id:03d}.npy"}
SPF = 3


def data(seed, n):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 2)).astype(np.float32),
            "y": (rng.integers(0, 100, n) + 1000 * seed).astype(np.int64)}


def pattern(out, layout, split, field):
    return os.path.join(out, LAYOUTS[layout].replace("{id:03d}", "*").format(
        field=field, split=split))


tree = file_digests


CHILD = textwrap.dedent("""
    import sys, time, numpy as np, npyload
    sys.path.insert(0, sys.argv[1])
    from test_write_property import data, LAYOUTS
    out, seed, n, split, layout, overwrite, kind = sys.argv[2:9]
    d = data(int(seed), int(n))
    class Slow:
        def __len__(self): return int(n)
        def __getitem__(self, i):
            time.sleep(0.02)
            return {k: v[i] for k, v in d.items()}
    src = Slow() if kind == "dict" else (Slow()[i] for i in range(int(n)))
    try:
        npyload.write(src, out, samples_per_file=3, layout=LAYOUTS[layout], split=split,
                      overwrite=overwrite == "1", num_workers=2, progress=False)
    except ValueError:
        pass
""")

step = st.fixed_dictionaries({
    "seed": st.integers(0, 2), "n": st.integers(2, 10),
    "split": st.sampled_from(["train", "val"]), "layout": st.sampled_from(list(LAYOUTS)),
    "overwrite": st.booleans(), "kind": st.sampled_from(["dict", "iterable"]),
    "kill": st.sampled_from([False, False, False, False, True])})


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=2, max_size=6))
def test_random_write_sequences(steps):
    base = tempfile.mkdtemp(prefix="npyload-prop-")
    out = os.path.join(base, "out")
    os.makedirs(os.path.join(base, "beside"))
    os.makedirs(out)
    np.save(os.path.join(base, "beside", "x_000.npy"), np.arange(3))
    np.save(os.path.join(out, "mine.npy"), np.arange(5))          # the user's own file
    outside = tree(os.path.join(base, "beside"))
    mine = tree(out)["mine.npy"]
    script = os.path.join(base, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    for i, s in enumerate(steps):
        before = tree(out)
        if s["kill"]:
            p = subprocess.Popen([sys.executable, script, os.path.dirname(__file__), out,
                                  str(s["seed"]), str(s["n"]), s["split"], s["layout"],
                                  "1" if s["overwrite"] else "0", s["kind"]])
            time.sleep(0.3 + (i % 4) * 0.15)
            p.send_signal(signal.SIGKILL)
            p.wait()
            # only complete files under their final names
            for d, _, fs in os.walk(out):
                for f in fs:
                    if f.endswith(".npy"):
                        np.load(os.path.join(d, f))
        else:
            d = data(s["seed"], s["n"])
            src = d if s["kind"] == "dict" else \
                ({k: v[j] for k, v in d.items()} for j in range(s["n"]))
            try:
                npyload.write(src, out, samples_per_file=SPF, layout=LAYOUTS[s["layout"]],
                              split=s["split"], overwrite=s["overwrite"], num_workers=2,
                              progress=False)
            except ValueError:
                assert tree(out) == before, (i, s)        # refused: nothing changed
            else:
                for k in ("x", "y"):
                    files = sorted(glob.glob(pattern(out, s["layout"], s["split"], k)))
                    got = np.concatenate([np.load(f) for f in files])
                    np.testing.assert_array_equal(got, d[k], err_msg=str((i, s)))
        assert tree(os.path.join(base, "beside")) == outside
        assert tree(out)["mine.npy"] == mine
    import shutil
    shutil.rmtree(base)
