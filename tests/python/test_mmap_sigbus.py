"""The mmap backend and truncation: a file truncated while the loader copies
from its mapping raises NpyloadError naming the file, never kills the
process with SIGBUS. Each scenario runs in a subprocess, so a death by
signal shows as a failure instead of taking pytest down."""
import subprocess
import sys
import textwrap

import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

SCRIPT = textwrap.dedent(r"""
    import os, sys, threading
    import numpy as np
    import npyload

    root = sys.argv[1]
    # 48 samples of 1 MiB: batches of 8 MiB, copies that take milliseconds.
    path = os.path.join(root, "big.npy")
    data = np.arange(48 * 262144, dtype=np.float32).reshape(48, 262144)
    np.save(path, data)
    size = os.path.getsize(path)

    loader = npyload.Loader({"x": [path]}, batch_size=8, io="mmap",
                            num_workers=2, prefetch=4, output="numpy")
    first = threading.Event()

    def truncate():
        first.wait()
        # Into the first sample: every copy in progress touches pages past
        # the new end.
        os.truncate(path, 4096 + 100)

    t = threading.Thread(target=truncate)
    t.start()
    try:
        for epoch in range(50):
            loader.set_epoch(epoch)
            for b in loader:
                # Whatever is delivered is right (a strided sample of it:
                # a slow consumer would leave the workers idle).
                idx = np.asarray(b.indices)
                x = np.asarray(b["x"])
                assert np.array_equal(x[:, ::997], data[idx, ::997]), \
                    "wrong bytes"
                first.set()
        print("NO ERROR")
        sys.exit(3)
    except npyload.NpyloadError as e:
        print("ERROR", e)
        sys.exit(0 if path in str(e) else 4)
    finally:
        first.set()
        t.join()
""")


@pytest.mark.parametrize("run", range(5))
def test_truncation_mid_epoch_raises_not_sigbus(tmp_path, run):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode >= 0, (
        f"the loader process died of signal {-r.returncode}: {out}")
    assert r.returncode == 0, out
    assert "big.npy" in r.stdout


HANDLER = textwrap.dedent(r"""
    import ctypes, gc, os, signal, sys
    import numpy as np
    import npyload

    libc = ctypes.CDLL(None, use_errno=True)
    def os_handler():
        # struct sigaction starts with the handler pointer (glibc, Linux).
        buf = ctypes.create_string_buffer(256)
        assert libc.sigaction(signal.SIGBUS, None, buf) == 0
        return bytes(buf.raw[:8])

    hits = []
    def mine(signum, frame):
        hits.append(signum)
    signal.signal(signal.SIGBUS, mine)
    before = os_handler()
    path = os.path.join(sys.argv[1], "h.npy")
    np.save(path, np.zeros((8, 16), np.float32))
    loaders = [npyload.Loader({"x": [path]}, batch_size=4, io="mmap",
                              output="numpy") for _ in range(2)]
    for L in loaders:
        assert sum(1 for _ in L) == 2
    assert os_handler() != before, "no SIGBUS handler while mmap loaders run"
    # A SIGBUS that is not a fault in a guarded copy reaches Python's.
    os.kill(os.getpid(), signal.SIGBUS)
    del L, loaders
    gc.collect()
    assert os_handler() == before, "the previous SIGBUS handler was not restored"
    os.kill(os.getpid(), signal.SIGBUS)
    assert hits == [signal.SIGBUS] * 2, hits
    print("OK")
""")


def test_user_sigbus_handler_survives_loaders(tmp_path):
    r = subprocess.run([sys.executable, "-c", HANDLER, str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"exit {r.returncode}: {out}"
    assert "OK" in r.stdout
