"""What bench/remote_bench.py and bench/mixed_bench.py share: their common
arguments, the captcha preset written with npyload-gen, SeaweedFS (the
tests' weed_server.py) serving it from a bucket, the tests' throttling
proxy, and the JSON they print and write. Not a benchmark itself."""
import argparse
import contextlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from weed_server import ThrottleProxy, WeedServer  # noqa: E402

# The emulated link of both benchmarks: 1 Gbit/s, 10 ms RTT.
LINK = {"rate": 125e6, "rtt": 0.010, "chunk": 65536}


def arguments(doc):
    """The parser with the arguments every S3 bench takes (--files,
    --build, --json); a bench adds its own."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=4, help="captcha shards (64 samples each)")
    ap.add_argument("--build", default="build", help="the build holding tools/npyload-gen")
    ap.add_argument("--json", default=None, help="also write the figures here")
    return ap


def write_captcha(build, data, files):
    """The captcha preset, `files` shards of 64 samples, into data."""
    subprocess.run([os.path.join(build, "tools", "npyload-gen"), "--preset", "captcha",
                    "--out", data, "--files", str(files), "--samples-per-file", "64"],
                   check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def served(work, data, bucket):
    """SeaweedFS in work/weed serving data under s3://bucket/captcha:
    yields (server, the s3:// prefix, the remote= configuration); stops
    the server on the way out."""
    srv = WeedServer(os.path.join(work, "weed")).start()
    try:
        srv.make_bucket(bucket)
        srv.put_tree(bucket, data, "captcha/")
        yield srv, f"s3://{bucket}/captcha", srv.remote()
    finally:
        srv.stop()


@contextlib.contextmanager
def link(srv):
    """The throttling proxy (LINK) in front of srv: yields it."""
    proxy = ThrottleProxy(srv.s3, **LINK)
    try:
        yield proxy
    finally:
        proxy.close()


def report(res, path):
    """Prints the figures and writes them to path (None: only printed)."""
    print(json.dumps(res, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
