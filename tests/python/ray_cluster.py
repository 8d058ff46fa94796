"""A real two-node Ray cluster on loopback for the Ray writer's tests and
benchmark: ``ray start --head`` and ``ray start --address=...`` as two
processes, each with ``--num-cpus``, a small object store, CPU only, its own
ports, and the head's own temp dir (the worker node uses the head's).

Each node runs as ``ray start --block`` in a session of its own, so that
stopping touches only this cluster's processes, never another Ray on the
machine (``ray stop`` would stop every Ray of the user): SIGTERM to each
``ray start`` (which stops its node's processes), then SIGKILL to whatever
is left in those sessions (the raylet's workers keep the session of the
``ray start`` that made them). Each ``ray start`` also gets SIGTERM when
the process that started it dies (PR_SET_PDEATHSIG): a crashed test run
leaves no cluster behind.

Run as a script, it starts a cluster, prints its address and waits for
Ctrl-C (for a benchmark by hand): ``python ray_cluster.py [NODES]``.
The cluster runs without token authentication (``RAY_AUTH_MODE=disabled``,
``driver_env()``): Ray 2.5x would otherwise write a token to
``~/.ray/auth_token``, shared by every Ray cluster of the user.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def ray_binary():
    """The `ray` executable beside this interpreter (or on PATH), or None."""
    cand = os.path.join(os.path.dirname(sys.executable), "ray")
    if os.access(cand, os.X_OK):
        return cand
    return shutil.which("ray")


def _free_ports(n):
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _die_with_parent():
    """In the child, before exec: SIGTERM when the process that started it
    dies (prctl PR_SET_PDEATHSIG), so that a test process that crashes or is
    killed does not leave its cluster running."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def _session_pids(sid):
    """Processes whose session id is sid (ps is procps's, on Debian)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    pids = []
    for line in out.splitlines():
        p, s = line.split()
        if int(s) == sid:
            pids.append(int(p))
    return pids


class RayCluster:
    """`nodes` Ray nodes on 127.0.0.1 with `cpus` CPUs and `object_store`
    bytes of object store each. `extra_env` is added to the nodes'
    environment (their workers inherit it: PYTHONPATH for the tests'
    helper modules)."""

    def __init__(self, nodes=2, cpus=1, object_store=100_000_000, extra_env=None):
        self.nodes, self.cpus, self.object_store = nodes, cpus, object_store
        # Short: Ray's unix sockets live under it (108 bytes at most).
        self.temp = tempfile.mkdtemp(prefix="npyray-", dir="/tmp")
        # No token authentication: Ray 2.5x would otherwise write a token to
        # ~/.ray/auth_token, shared by every cluster of the user, and a
        # driver reads its mode when ray is imported (too early for a test
        # to set). A test cluster on loopback, stopped at the end.
        self.auth = {"RAY_AUTH_MODE": "disabled"}
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
                        RAY_DISABLE_IMPORT_WARNING="1", **self.auth, **(extra_env or {}))
        self.procs = []
        self.port = None

    def driver_env(self):
        """What a driver's environment needs to connect (os.environ.update it
        before ray.init)."""
        return dict(self.auth, RAY_USAGE_STATS_ENABLED="0")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def _start_node(self, head):
        ports = _free_ports(4)
        args = [ray_binary(), "start", "--block", "--node-ip-address=127.0.0.1",
                f"--num-cpus={self.cpus}", "--num-gpus=0",
                f"--object-store-memory={self.object_store}",
                "--min-worker-port=0", "--max-worker-port=0",
                f"--dashboard-agent-listen-port={ports[0]}",
                f"--metrics-export-port={ports[1]}",
                f"--runtime-env-agent-port={ports[2]}", "--disable-usage-stats"]
        if head:
            self.port = ports[3]
            args += ["--head", f"--port={self.port}", f"--temp-dir={self.temp}",
                     "--include-dashboard=false"]
        else:
            args += [f"--address={self.address}"]
        n = len(self.procs)
        log = open(os.path.join(self.temp, f"node{n}.log"), "wb")
        try:
            p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=self.env,
                                 start_new_session=True, preexec_fn=_die_with_parent)
        finally:
            log.close()
        self.procs.append(p)

    def start(self, timeout=180.0):
        """Starts the nodes and waits (bounded) until all of them are alive."""
        if ray_binary() is None:
            raise RuntimeError("ray not found: pip install 'npyload[ray]'")
        try:
            self._start_node(True)
            self._wait(1, timeout)
            for _ in range(self.nodes - 1):
                self._start_node(False)
            self._wait(self.nodes, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, n, timeout):
        deadline = time.monotonic() + timeout
        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', "
                 "log_to_driver=False); print(sum(1 for x in ray.nodes() if x['Alive']))")
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"ray start exited with {p.returncode}; see "
                                       f"{self.temp}/node*.log")
            try:
                r = subprocess.run([sys.executable, "-c", probe, self.address], env=self.env,
                                   capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0 and r.stdout.strip().isdigit() and \
                    int(r.stdout.strip()) >= n:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} Ray node(s) not alive within {timeout} s; see "
                                   f"{self.temp}/node*.log")
            time.sleep(1)

    def worker_pids(self):
        """Every process of this cluster (its sessions)."""
        return [pid for p in self.procs for pid in _session_pids(p.pid)]

    def stop(self, timeout=30.0):
        """Stops this cluster's processes only, and removes its temp dir."""
        for p in reversed(self.procs):   # worker nodes first, then the head
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            for pid in _session_pids(p.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if p.poll() is None:
                p.wait(10)
        self.procs = []
        shutil.rmtree(self.temp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    c = RayCluster(nodes=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    c.start()
    print(json.dumps({"address": c.address, "env": c.driver_env()}), flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
