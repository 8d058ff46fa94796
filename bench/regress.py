#!/usr/bin/env python3
# usage: python3 bench/regress.py [BASE] [--quick] [--repeats N] [--seconds S] [--only captcha,small_rows,transforms,packed] [--json FILE] [--callgrind [--keep-callgrind DIR]]
"""The regression guard: the core benchmarks for a base commit and the work
tree, built side by side and run in one go, alternating, with the ratio
tree/base per benchmark.

BASE is any commit (default: the merge-base of HEAD and main). The base is
exported with `git archive` and built once into build-regress/base-SHA
(kept: later runs reuse it); the work tree, uncommitted changes included,
is built into build-regress/tree (incrementally). Both are Release builds of
the library, the tools and the Python extension. Then, for --repeats rounds,
every benchmark runs for the base and for the tree, in alternating order
(base first on even rounds, tree first on odd ones), so that a machine
whose speed drifts moves both sides alike:

  captcha     npyload-gen --preset captcha (8 files, 608 MiB), page cache,
              npyload-bench: 128-sample shuffled batches, 2 workers,
              prefetch 4 (slots)
  small_rows  CIFAR-like rows (3x32x32 uint8 + int64 label, 600,000
              samples in 6 files), page cache, npyload-bench: 256-row
              shuffled batches, 2 workers, prefetch 4; also the loader's
              share of its run's gather_copy ceiling and its ratio to
              numpy's one-thread fancy-index gather (X[idx]; Y[idx] per
              batch of a permutation, arrays in RAM; measured in each round)
  transforms  uint8 (3,64,64) images (64 files of 64), page cache, the
              Python Loader with Transform("float16", scale=1/255, mean,
              std, channels_last=True): 128-row shuffled batches, 2
              workers, 4 slots (bench/transform_compare.py's loader side)
  packed      the captcha files packed to .npy.zst (npyload-pack), page
              cache, npyload-bench as for captcha

Printed: per benchmark, the median samples/s of each side over the rounds,
the ratio tree/base (the median of the rounds' ratios, min-max) and the
ratio of the sides' best rounds (other load only slows a run: on a shared
machine the best round is the nearest to a quiet one). Timings move with
the load; --callgrind counts instructions per batch instead, which do not.
--quick: smaller data, 0.5 s runs, 2 rounds (a smoke test of the script,
not a measurement). Data lives in --data (default
/tmp/npyload-regress-data, kept between runs). Exit status: 0 when every
benchmark ran on both sides, 1 otherwise, 2 for a build failure.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ("captcha", "small_rows", "transforms", "packed")
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


def git(*args):
    return sh(["git", "-C", str(ROOT), *args], capture_output=True).stdout.strip()


class Side:
    """One build: its tools and its Python package directory."""

    def __init__(self, name, label, src, bdir):
        self.name, self.label, self.src, self.bdir = name, label, Path(src), Path(bdir)
        self.pkg = self.bdir / "py"
        self.no_repeat = False

    def tool(self, t):
        return str(self.bdir / "tools" / t)

    def build(self, log):
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        cfg = ["cmake", "-S", str(self.src), "-B", str(self.bdir), *gen,
               "-DCMAKE_BUILD_TYPE=Release", "-DNPYLOAD_BUILD_TESTS=OFF",
               "-DNPYLOAD_BUILD_PYTHON=ON", "-DNPYLOAD_CUDA_KERNELS=OFF",
               f"-DPython_EXECUTABLE={sys.executable}"]
        jobs = str(os.cpu_count() or 2)
        with open(log, "a") as f:
            if not (self.bdir / "CMakeCache.txt").exists():
                sh(cfg, stdout=f, stderr=subprocess.STDOUT)
            sh(["cmake", "--build", str(self.bdir), "-j", jobs], stdout=f,
               stderr=subprocess.STDOUT)
        # The package as pip would lay it out: the sources plus the extension.
        if self.pkg.exists():
            shutil.rmtree(self.pkg)
        shutil.copytree(self.src / "python_bindings" / "npyload", self.pkg / "npyload")
        ext = sorted((self.bdir / "python_bindings").glob("_npyload*.so"))
        if not ext:
            raise RuntimeError(f"{self.bdir}: no Python extension was built")
        shutil.copy2(ext[0], self.pkg / "npyload")
        helptext = sh([self.tool("npyload-bench"), "--help"], capture_output=True).stdout
        self.no_repeat = "--no-repeat" in helptext


def default_base():
    """The merge-base of HEAD and main (origin/main when there is no local
    main)."""
    for ref in ("main", "origin/main"):
        try:
            return git("merge-base", "HEAD", ref)
        except subprocess.CalledProcessError:
            continue
    raise subprocess.CalledProcessError(1, "git merge-base")


def prepare_sides(base, log):
    out = ROOT / "build-regress"
    out.mkdir(exist_ok=True)
    sha = git("rev-parse", "--verify", f"{base}^{{commit}}")
    bsrc, bdir = out / f"src-{sha[:12]}", out / f"base-{sha[:12]}"
    if not (bsrc / "CMakeLists.txt").exists():
        tmp = Path(tempfile.mkdtemp(dir=out))
        arc = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha], stdout=subprocess.PIPE)
        sh(["tar", "-x", "-C", str(tmp)], stdin=arc.stdout)
        if arc.wait():
            raise RuntimeError(f"git archive {sha} failed")
        tmp.rename(bsrc)
    head = git("rev-parse", "--short=12", "HEAD")
    dirty = " + changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    sides = [Side("base", f"{sha[:12]}", bsrc, bdir),
             Side("tree", f"work tree ({head}{dirty})", ROOT, out / "tree")]
    for s in sides:
        t0 = time.time()
        print(f"building {s.name}: {s.label} in {s.bdir} ...", flush=True)
        s.build(log)
        print(f"  {time.time() - t0:.0f} s", flush=True)
    return sides


# ---------------------------------------------------------------- data


def make_data(d, tool, quick):
    """Writes what the benchmarks read (once; kept in d) with the tree's tools."""
    d.mkdir(parents=True, exist_ok=True)
    cap_files = 2 if quick else 8
    cap = d / f"captcha{cap_files}"
    if not (cap / "done").exists():
        sh([tool("npyload-gen"), "--preset", "captcha", "--out", str(cap), "--files",
            str(cap_files), "--quiet"])
        (cap / "done").touch()
    packed = d / f"packed{cap_files}"
    if not (packed / "done").exists():
        for sub in ("images/train", "labels/train"):
            (packed / sub).mkdir(parents=True, exist_ok=True)
            for f in sorted((cap / sub).glob("*.npy")):
                sh([tool("npyload-pack"), str(f), "-o", str(packed / sub / (f.name + ".zst"))],
                   stdout=subprocess.DEVNULL)
        (packed / "done").touch()
    per = 10000 if quick else 100000
    rows = d / f"rows{per}"
    if not (rows / "done").exists():
        for prefix, shape, dt in (("x", "3,32,32", "|u1"), ("y", "", "<i8")):
            sh([tool("npyload-gen"), "--generic", "--out", str(rows), "--prefix", prefix,
                "--shape", shape, "--dtype", dt, "--files", "6", "--samples-per-file",
                str(per), "--quiet"])
        (rows / "done").touch()
    img_files = 16 if quick else 64
    imgs = d / f"images{img_files}"
    if not (imgs / "done").exists():
        sh([tool("npyload-gen"), "--generic", "--out", str(imgs), "--prefix", "img",
            "--shape", "3,64,64", "--dtype", "|u1", "--files", str(img_files),
            "--samples-per-file", "64", "--quiet"])
        (imgs / "done").touch()
    return {"captcha": cap, "packed": packed, "rows": rows, "images": imgs}


def captcha_fields(d, ext):
    return [f"images={d}/images/train/*.{ext}", f"heatmaps={d}/labels/train/*_heatmaps.{ext}",
            f"offsets={d}/labels/train/*_offsets.{ext}"]


def warm(data, bench):
    """Reads the benchmark's files, so that the run starts with all of them in
    the page cache. Before every run: a machine may page out cached pages
    that were not touched for a while (proactive reclaim such as DAMON's),
    and the loader's gather path reads a file that is not all cached with
    the read backend instead (npyload_io_gather.c), which would measure that
    instead."""
    d = data[{"captcha": "captcha", "packed": "packed", "small_rows": "rows",
              "transforms": "images"}[bench]]
    for p in sorted(d.rglob("*.npy*")):
        with open(p, "rb") as f:
            while f.readinto(WARM_BUF):
                pass


WARM_BUF = bytearray(1 << 24)


# ---------------------------------------------------------------- runs


def run_bench(side, fields, batch, seconds, tmp):
    """npyload-bench, one configuration: samples/s and the run's JSON."""
    js = Path(tmp) / f"{side.name}.json"
    cmd = [side.tool("npyload-bench"), *fields, "--batch-size", str(batch), "--shuffle",
           "--workers", "2", "--prefetch", "4", "--seconds", str(seconds), "--json", str(js),
           "--quiet"]
    if side.no_repeat:
        cmd.append("--no-repeat")
    p = subprocess.run(cmd, text=True, capture_output=True)
    if p.returncode or not js.exists():
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    j = json.loads(js.read_text())
    runs = [r for r in j["runs"] if r.get("ok")]
    if not runs:
        raise RuntimeError(f"npyload-bench: no run succeeded: {j['runs']}")
    return runs[0]["samples_per_s"], j


def run_small_rows(side, data, seconds, tmp):
    sps, j = run_bench(side, [f"x={data['rows']}/x_*.npy", f"y={data['rows']}/y_*.npy"], 256,
                       seconds, tmp)
    ce = {c["name"]: c["gbps"] for c in j["ceilings"] if c["measured"]}
    g = ce.get("gather_copy")
    return sps, {"of_gather_copy": j["runs"][0]["gbps"] / g if g else None}


def child_spec(bench, data, **run):
    """What the Python child loads for a benchmark: the same loader as the
    npyload-bench runs (fields, batch, 2 workers, 4 slots), for
    `seconds` (timed after the first batch) or `batches`."""
    cap, packed, rows = data["captcha"], data["packed"], data["rows"]
    fields = {
        "captcha": {"images": f"{cap}/images/train/*.npy",
                    "heatmaps": f"{cap}/labels/train/*_heatmaps.npy",
                    "offsets": f"{cap}/labels/train/*_offsets.npy"},
        "packed": {"images": f"{packed}/images/train/*.npy.zst",
                   "heatmaps": f"{packed}/labels/train/*_heatmaps.npy.zst",
                   "offsets": f"{packed}/labels/train/*_offsets.npy.zst"},
        "small_rows": {"x": f"{rows}/x_*.npy", "y": f"{rows}/y_*.npy"},
        "transforms": {"images": f"{data['images']}/img_*.npy"},
    }[bench]
    return dict(fields=fields, batch=256 if bench == "small_rows" else 128,
                transforms=bench == "transforms", **run)


def run_child(side, spec, tmp, wrap=()):
    """The Python child on one side's package (PYTHONPATH): its JSON line."""
    # One OpenBLAS thread: numpy's import starts a pool that spins on the
    # cores the loader measures.
    env = dict(os.environ, PYTHONPATH=str(side.pkg), PYTHONHASHSEED="0",
               OPENBLAS_NUM_THREADS="1")
    cmd = [*wrap, sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    p = subprocess.run(cmd, text=True, capture_output=True, env=env, cwd=tmp)
    if p.returncode:
        raise RuntimeError(f"python child ({side.name}): {p.stderr.strip()[-600:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if not r["module"].startswith(str(side.pkg)):
        raise RuntimeError(f"python child ({side.name}) imported {r['module']}, not {side.pkg}")
    return r


def run_transforms(side, data, seconds, tmp):
    r = run_child(side, child_spec("transforms", data, seconds=seconds), tmp)
    return r["samples_per_s"], {}


def child(spec):
    """In a child whose PYTHONPATH is one side's package: one loader as
    spec says, consumed without touching the data; prints one JSON line
    (samples/s after the first batch, batches, context switches)."""
    import resource
    import npyload
    tr = None
    if spec["transforms"]:
        tr = {"images": npyload.Transform("float16", scale=1.0 / 255.0, mean=MEAN, std=STD,
                                          channels_last=True)}
    kw = {"read_ahead": False} if spec.get("read_ahead") is False else {}
    L = npyload.Loader(spec["fields"], batch_size=spec["batch"], shuffle=True, seed=1,
                       num_workers=2, prefetch=3, output="numpy", transforms=tr, **kw)
    seconds, batches = spec.get("seconds"), spec.get("batches")
    n = nb = 0
    t0 = ru0 = None
    epoch = 0
    done = False
    try:
        while not done:
            L.set_epoch(epoch)
            epoch += 1
            for b in L:
                if t0 is None:  # timed after the first batch
                    t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                    continue
                n += len(b.indices)
                nb += 1
                del b
                if (batches and nb >= batches) or (
                        seconds and time.perf_counter() - t0 >= seconds):
                    done = True
                    break
        dt = time.perf_counter() - t0
        ru = resource.getrusage(resource.RUSAGE_SELF)
        if spec.get("settle"):
            time.sleep(spec["settle"])  # the workers fill the free slots
        st = L.stats()
    finally:
        L.close()
    print(json.dumps({
        "samples_per_s": n / dt, "batches": nb,
        "cpu_s": ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime,
        "csw": ru.ru_nvcsw + ru.ru_nivcsw - ru0.ru_nvcsw - ru0.ru_nivcsw,
        "bytes_read": st["bytes_read"], "transform_ns": st.get("transform_ns", 0),
        "io_ns": st["io_ns"], "module": npyload.__file__}))


def callgrind_ir(side, spec, tmp, out):
    """Instructions (callgrind's Ir, the whole process) of a child run and
    the bytes its workers read; callgrind's profile is written to `out`."""
    r = run_child(side, spec, tmp, wrap=("valgrind", "--tool=callgrind",
                                         f"--callgrind-out-file={out}"))
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1]), r["bytes_read"]
    raise RuntimeError(f"{out}: no totals")


# Stored bytes of one sample (every field), to turn bytes read into batches.
SAMPLE_BYTES = {"captcha": 1245184, "packed": 1245184, "small_rows": 3 * 32 * 32 + 8,
                "transforms": 3 * 64 * 64}
# Batches consumed by the two callgrind runs: the difference must dwarf the
# runs' own spread (a few million instructions: threads interleave
# differently from run to run).
CALLGRIND_BATCHES = {"captcha": (8, 40), "packed": (4, 12), "small_rows": (20, 1020),
                     "transforms": (10, 60)}


def callgrind_mode(sides, data, only, quick, tmp, keep=None):
    """Instructions per batch, repeatable on a busy machine: callgrind of
    the Python child consuming n1 and n2 batches. The workers read ahead of
    the consumer by a number of batches that depends on timing, so the cost
    is divided by what they read: (Ir(n2) - Ir(n1)) / (bytes read(n2) -
    bytes read(n1)) x the bytes of a full batch. Start-up and first touches
    cancel out. Threads run one at a time under valgrind: this counts
    instructions (the hand-offs' included), not waits or wake-ups. With
    keep, the profiles stay there as cg.BENCH.SIDE.BATCHES.out, for
    callgrind_annotate (per function: diff the two sides' n2 runs)."""
    outdir = Path(keep or tmp)
    outdir.mkdir(parents=True, exist_ok=True)
    print("\ncallgrind: instructions per batch, whole process (workers, read-ahead "
          "threads, consumer)")
    print(f"{'benchmark':<12} {'base':>14} {'tree':>14} {'tree/base':>10}")
    res = {}
    for b in only:
        per = {}
        bb = SAMPLE_BYTES[b] * child_spec(b, data)["batch"]
        n1, n2 = CALLGRIND_BATCHES[b]
        if quick:
            n2 = n1 + (n2 - n1) // 4
        for s in sides:
            try:
                warm(data, b)
                ir1, rd1 = callgrind_ir(s, child_spec(b, data, batches=n1, settle=2), tmp,
                                        outdir / f"cg.{b}.{s.name}.{n1}.out")
                warm(data, b)
                ir2, rd2 = callgrind_ir(s, child_spec(b, data, batches=n2, settle=2), tmp,
                                        outdir / f"cg.{b}.{s.name}.{n2}.out")
            except (RuntimeError, subprocess.CalledProcessError) as e:
                print(f"  {b} {s.name}: FAILED: {e}", file=sys.stderr)
                continue
            if rd2 <= rd1:
                print(f"  {b} {s.name}: no more bytes read for more batches", file=sys.stderr)
                continue
            per[s.name] = (ir2 - ir1) / (rd2 - rd1) * bb
        res[b] = per
        if len(per) == 2:
            print(f"{b:<12} {per['base']:>14,.0f} {per['tree']:>14,.0f} "
                  f"{per['tree'] / per['base']:>10.3f}", flush=True)
    return res


def rows_in_ram(rows_dir, prefix):
    """The small-rows files PREFIX_*.npy of rows_dir as one array in RAM,
    filled file by file."""
    import numpy as np
    parts = [np.load(p, mmap_mode="r") for p in sorted(Path(rows_dir).glob(f"{prefix}_*.npy"))]
    a = np.empty((sum(len(x) for x in parts),) + parts[0].shape[1:], parts[0].dtype)
    at = 0
    for x in parts:
        a[at:at + len(x)] = x
        at += len(x)
    return a


def numpy_gather(rows_dir, seconds):
    """numpy, one thread: X[idx]; Y[idx] per 256-row batch of a permutation
    of the small-rows data loaded in RAM (bench/README.md, "Small rows")."""
    try:
        import numpy as np
    except ImportError:
        return None
    X, Y = rows_in_ram(rows_dir, "x"), rows_in_ram(rows_dir, "y")
    perm = np.random.default_rng(0).permutation(len(X))
    n, i, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        idx = perm[i:i + 256]
        i = i + 256 if i + 512 <= len(perm) else 0
        X[idx]
        Y[idx]
        n += len(idx)
    return n / (time.perf_counter() - t0)


# ---------------------------------------------------------------- report


def summarise(res):
    out = {}
    for b, per in res.items():
        base, tree = per["base"], per["tree"]
        ratios = [t / bb for t, bb in zip(tree, base) if bb]
        out[b] = {"base": base, "tree": tree, "ratios": ratios,
                  "base_median": statistics.median(base) if base else None,
                  "tree_median": statistics.median(tree) if tree else None,
                  "ratio_median": statistics.median(ratios) if ratios else None,
                  # Other load only slows a run down: the best round of each
                  # side is the nearest to a quiet machine.
                  "ratio_best": max(tree) / max(base) if ratios else None}
        for k in ("of_gather_copy", "x_numpy"):
            for s in ("base", "tree"):
                v = per.get(f"{s}_{k}")
                if v:
                    out[b][f"{s}_{k}"] = v
    return out


def fmt_range(v, f="{:.2f}"):
    return f"{f.format(min(v))}-{f.format(max(v))}" if v else "-"


def print_table(summ, sides, rounds):
    print(f"\nbase = {sides[0].label}, tree = {sides[1].label}; {rounds} rounds; "
          "samples/s medians; tree/base: the median of the rounds' ratios (min-max), "
          "and the ratio of each side's best round")
    print(f"{'benchmark':<12} {'base':>12} {'tree':>12} {'tree/base':>10} {'range':>13} "
          f"{'best':>7}")
    for b, s in summ.items():
        if s["ratio_median"] is None:
            print(f"{b:<12} {'failed':>12}")
            continue
        print(f"{b:<12} {s['base_median']:>12,.0f} {s['tree_median']:>12,.0f} "
              f"{s['ratio_median']:>10.3f} {fmt_range(s['ratios'], '{:.3f}'):>13} "
              f"{s['ratio_best']:>7.3f}")
        for k, what in (("of_gather_copy", "of gather_copy"), ("x_numpy", "x numpy 1-thread")):
            if f"base_{k}" in s or f"tree_{k}" in s:
                parts = [f"{side} {fmt_range(s.get(f'{side}_{k}', []))}"
                         for side in ("base", "tree")]
                print(f"{'':<12} {what}: " + ", ".join(parts))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("base", nargs="?", default=None,
                    help="the base commit (default: git merge-base HEAD main)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="rounds (default 3; 2 with --quick; 5 or more for figures to quote)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="timed seconds per run (default 2; 0.5 with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny data and runs: a smoke test")
    ap.add_argument("--only", default=",".join(BENCHES),
                    help=f"comma-separated subset of {','.join(BENCHES)}")
    ap.add_argument("--data", default="/tmp/npyload-regress-data", help="data directory (kept)")
    ap.add_argument("--json", default=None, help="write every figure here")
    ap.add_argument("--callgrind", action="store_true",
                    help="instead of timing: instructions per batch under callgrind "
                    "(repeatable on a busy machine; needs valgrind)")
    ap.add_argument("--keep-callgrind", metavar="DIR", default=None,
                    help="with --callgrind: keep callgrind's profiles in DIR "
                    "(cg.BENCH.SIDE.BATCHES.out) for callgrind_annotate")
    a = ap.parse_args()
    only = [b for b in a.only.split(",") if b]
    for b in only:
        if b not in BENCHES:
            ap.error(f"--only: unknown benchmark '{b}' ({', '.join(BENCHES)})")
    rounds = a.repeats or (2 if a.quick else 3)
    secs = a.seconds or (0.5 if a.quick else 2.0)
    try:
        base = a.base or default_base()
    except subprocess.CalledProcessError:
        ap.error("no merge-base with main or origin/main: name the BASE commit")
    log = ROOT / "build-regress" / "build.log"
    (ROOT / "build-regress").mkdir(exist_ok=True)
    try:
        sides = prepare_sides(base, log)
    except (subprocess.CalledProcessError, RuntimeError) as e:
        print(f"regress: build failed ({e}); see {log}", file=sys.stderr)
        return 2
    try:
        data = make_data(Path(a.data), sides[1].tool, a.quick)
    except subprocess.CalledProcessError as e:
        print(f"regress: writing the data in {a.data} failed: {e}", file=sys.stderr)
        return 2
    if a.callgrind:
        with tempfile.TemporaryDirectory(prefix="npyload-regress-") as tmp:
            cg = callgrind_mode(sides, data, only, a.quick, tmp, a.keep_callgrind)
        if a.json:
            Path(a.json).write_text(json.dumps({
                "base": sides[0].label, "tree": sides[1].label, "callgrind_ir_per_batch": cg},
                indent=1))
        return 0 if all(len(v) == 2 for v in cg.values()) else 1
    runners = {
        "captcha": lambda s, t: (run_bench(s, captcha_fields(data["captcha"], "npy"), 128,
                                           secs, t)[0], {}),
        "small_rows": lambda s, t: run_small_rows(s, data, secs, t),
        "transforms": lambda s, t: run_transforms(s, data, secs, t),
        "packed": lambda s, t: (run_bench(s, captcha_fields(data["packed"], "npy.zst"), 128,
                                          secs, t)[0], {}),
    }
    res = {b: {"base": [], "tree": []} for b in only}
    failed = False
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="npyload-regress-") as tmp:
        for r in range(rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for b in only:
                row = {}
                for s in order:
                    try:
                        warm(data, b)
                        sps, extra = runners[b](s, tmp)
                    except (RuntimeError, subprocess.CalledProcessError) as e:
                        print(f"  {b} {s.name}: FAILED: {e}", file=sys.stderr)
                        failed = True
                        continue
                    row[s.name] = sps
                    for k, v in extra.items():
                        if v is not None:
                            res[b].setdefault(f"{s.name}_{k}", []).append(v)
                if len(row) == 2:  # pairs only, so that ratios stay paired
                    for s in ("base", "tree"):
                        res[b][s].append(row[s])
                if b == "small_rows" and len(row) == 2:
                    warm(data, b)
                    npg = numpy_gather(data["rows"], secs)
                    if npg:
                        for s in ("base", "tree"):
                            res[b].setdefault(f"{s}_x_numpy", []).append(row[s] / npg)
                        res[b].setdefault("numpy_gather", []).append(npg)
                print(f"round {r + 1}/{rounds} {b:<11} " +
                      "  ".join(f"{k} {v:,.0f}" for k, v in row.items()), flush=True)
    summ = summarise(res)
    print_table(summ, sides, rounds)
    print(f"({time.time() - t_start:.0f} s of runs; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f})")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "base": sides[0].label, "tree": sides[1].label, "rounds": rounds,
            "seconds": secs, "quick": a.quick, "raw": res, "summary": summ}, indent=1))
    return 1 if failed or any(not res[b]["tree"] for b in only) else 0


if __name__ == "__main__":
    sys.exit(main())
