"""fork() and an npyload loader (issue 11 item 6).

A child of a process that created a loader inherits the loader's memory but
none of its worker threads. Using the inherited loader there must raise
NpyloadError saying so (never hang), a child that never touches it must be
able to exit, and the parent must go on as if nothing happened.

Every scenario runs in a fresh interpreter under a timeout, and every child
is waited for with a deadline and killed past it: a hang fails the test, it
never blocks the suite. The deadlines are failure bounds, not measurements.
"""
import os
import subprocess
import sys
import textwrap

import pytest

npyload = pytest.importorskip("npyload", reason="npyload is not installed (run `pip install .`)")

if not hasattr(os, "fork"):  # pragma: no cover - Linux only project
    pytest.skip("os.fork is not available here", allow_module_level=True)

# Shared by the scripts: a loader over the dataset, numpy's reference values,
# a check of a batch against them, and a wait for a child with a deadline.
PRELUDE = textwrap.dedent("""
    import glob, os, signal, sys, time
    import numpy as np
    import npyload

    globs = dict(images=sys.argv[1], labels=sys.argv[2], mask=sys.argv[3])
    ref = {n: np.concatenate([np.load(p) for p in sorted(glob.glob(g))])
           for n, g in globs.items()}

    def check(b):
        for n in globs:
            np.testing.assert_array_equal(np.asarray(b[n]), ref[n][np.asarray(b.indices)])

    def wait_child(pid, deadline_s=30.0):
        # (exit status, or None when it had to be killed as hung)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return None

    loader = npyload.Loader(globs, batch_size=3, shuffle=True, seed=9,
                            num_workers=3, prefetch=4, output="numpy")
    it = iter(loader)
    for _ in range(2):
        check(next(it))
""")

CHILD_ITERATES = PRELUDE + textwrap.dedent("""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            next(it)
            msg = "no error"
        except npyload.NpyloadError as e:
            # the library's own code for it, once its header has one
            want = getattr(npyload._npyload, "EFORKED", e.code)
            msg = "NpyloadError: " + ("" if e.code == want else "wrong code %r: " % e.code) + str(e)
        except BaseException as e:
            msg = type(e).__name__ + ": " + str(e)
        os.write(w, msg.encode("utf-8", "replace"))
        os.close(w)
        # a normal exit: the interpreter finalises, the inherited loader is
        # deallocated (npyload_loader_destroy runs in the child)
        sys.exit(0)
    os.close(w)
    code = wait_child(pid)
    msg = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        msg += chunk
    print("child:", msg.decode())
    print("child exit:", code)
    # the parent is unaffected: the rest of the epoch, then a new one
    n = 2
    for b in it:
        check(b)
        n += 1
    assert n == len(loader), (n, len(loader))
    loader.set_epoch(1)
    assert sum(1 for b in loader if check(b) is None) == len(loader)
    loader.close()
    print("parent ok")
""")

MP_CHILD_IDLE = PRELUDE + textwrap.dedent("""
    import multiprocessing as mp

    def work(q):
        q.put(sum(range(10)))   # never touches the loader

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=work, args=(q,))
    p.start()
    p.join(30)
    hung = p.is_alive()
    if hung:
        p.kill()
        p.join()
    print("mp child:", "hung" if hung else p.exitcode, q.get(timeout=5) if not hung else None)

    # a plain fork whose child exits through the interpreter's finalisation
    # (the inherited loader is deallocated there) without using the loader
    pid = os.fork()
    if pid == 0:
        sys.exit(7)
    print("fork child exit:", wait_child(pid))

    for b in it:
        check(b)
    loader.close()
    print("parent ok")
""")


def run_script(tmp_path, dataset, text, timeout=120):
    globs, _ = dataset
    script = tmp_path / "fork_case.py"
    script.write_text(text)
    try:
        p = subprocess.run([sys.executable, str(script), globs["images"], globs["labels"],
                            globs["mask"]], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the scenario hung (killed after {timeout}s); output so far:\n"
                    f"{e.stdout}\n{e.stderr}")
    return p


def test_child_using_inherited_loader_gets_error_and_exits(tmp_path, dataset):
    p = run_script(tmp_path, dataset, CHILD_ITERATES)
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    assert "child exit: 0" in out, out + p.stderr      # not None (= hung, killed)
    child = next(line for line in out.splitlines() if line.startswith("child:"))
    assert child.startswith("child: NpyloadError:"), child
    assert "fork" in child and "wrong code" not in child, child
    assert "parent ok" in out


def test_multiprocessing_fork_child_exits(tmp_path, dataset):
    p = run_script(tmp_path, dataset, MP_CHILD_IDLE)
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    assert "mp child: 0 45" in out, out + p.stderr
    assert "fork child exit: 7" in out, out + p.stderr
    assert "parent ok" in out
