"""``npyload.cost_model`` and ``npyload-model``: what a job of N nodes
reading a dataset from an object store costs in requests, bytes and time,
and whether it will be fed, before it runs.

The model (every formula below is what the code computes; symbols per
node unless said otherwise):

Inputs. Dataset: N samples; per field f its stored bytes D_f (the objects'
sizes: compressed for .npy.zst), its cache blocks K_f (sum over its
objects of ceil(size / B)), and F objects in all; D = sum D_f, s = D / N.
Job: n nodes, r ranks per node, lambda samples/s per rank (the demand,
capped by what a rank reaches from local files: CPU and disk, which the
model takes as an input rather than predicting; inf: unbounded), batch b, W reading threads per rank, cache C
bytes per node, shuffle (global, local, none), E epochs. Store: G GET/s
per prefix and p prefixes, link L bytes/s per node, round trip T = RTT +
the store's first-byte time. Library: block B (cache_block), the fill's
GET size R (request_bytes) and Q GETs in flight (inflight), Qt GETs in
flight per reading thread (max_inflight), h probe GETs per object at a
loader's start (1; 2 for .npy.zst and narrowed files over 4 KiB).

Throughput of a link with O requests of X bytes in flight (each waits T,
then the bodies share L): Phi(O, X) = L * O X / (O X + L T), capped by
the cache disk's synced write rate Wd (every fetched block is written and
fdatasync'ed once; default unbounded).

1. The part cached: P = min(D, 0.9 C) (the cache evicts down to 90 % of
   its bound); hit fraction in later epochs h_c = P / D.

2. Bulk fill (npyload.prefetch, per node, all nodes at once): requests
   F (probes, 16 in flight) + sum over objects of ceil(min(size, left of
   P) / R); mean GET size X_f = P / fill GETs; rate
   Phi_f = min(Phi(Q, X_f), G p X_f / n) (the store's GET limit shared by
   the n nodes); time to a warm cache
   t_warm = max(ceil(F / 16) (T + 4096 / L), n F / (G p)) + P / Phi_f.

3. On demand, epoch 1 (no fill; the cache fills as samples are read): at
   a node's progress x in [0, 1] of its N / n samples, a sample's block of
   field f must still be fetched with probability
   q_f(x) = (1 - x / n)^(m_f - 1) under a global shuffle, where
   m_f = N / K_f samples share a block (the node has met each of them with
   probability x / n); with a local shuffle or none, blocks are met in file
   order: q_f = K_f u_f / (N / n) with u_f = 1 - (1 - 1/n)^m_f the share
   of blocks a node touches. Bytes per sample b(x) = sum_f (D_f / K_f)
   q_f(x); GETs per sample g(x) = sum_f q_f(x); GETs in flight
   O(x) = r W min(Qt, b g(x)); samples/s of the node
   S(x) = min(r lambda, Phi(O(x), b(x) / g(x)) / b(x), G p / (n g(x))).
   Epoch 1 takes t_1 = t_probe + integral over x of (N / n) / S(x) (400
   steps), where every rank's start probes every object first:
   t_probe = max(ceil(H / 16) (T + 4096 / L), n r H / (G p)) with H the
   sum of h over the objects; bytes
   fetched = sum_f D_f u_f; GETs = sum_f K_f u_f + r H. The cache is
   warm (when P = D) once 99 % of the blocks were met: after
   e = ln(0.01) / (m ln(1 - 1/n)) epochs under a global shuffle (1 with
   one node or without a global shuffle), t_warm = t_1 ceil(e).

4. Later epochs: a fraction 1 - h_c of the epoch-1 traffic (random access
   over a cache that holds P of D hits with probability P / D); samples/s
   S = min(r lambda, Phi(r W Qt', X) / b', G p / (n g')) with b', g' the
   epoch-1 means scaled by 1 - h_c (S = r lambda when P = D: local reads
   are not modelled; the local disk must keep up, which npyload-bench
   measures).

5. The job: GETs/s at the store = n x a node's GETs/s, against G p; fed
   when every epoch's S >= r lambda (epoch 1 separately: with a fill
   before the job, epoch 1 is a later epoch).

What it leaves out: CPU (decode, transforms, the loader's copies), the
local disk, TCP slow start, the store's own bandwidth limit per prefix,
and LRU effects beyond the hit fraction (with P < D the cache may evict
the filled part; the fill itself never evicts what it filled).
"""
from __future__ import annotations

import argparse as _argparse
import glob as _glob
import math as _math
import sys as _sys
from collections.abc import Mapping, Sequence
from typing import Any

from ._prefetch import _bytes, _human, _write_json

_PROBE_CONC = 16


def _phi(L: float, O: float, X: float, T: float) -> float:
    """Bytes/s of a link of L bytes/s with O requests of X bytes in flight,
    each waiting T before its body."""
    if O <= 0 or X <= 0:
        return 0.0
    if T <= 0:
        return L
    return L * O * X / (O * X + L * T)


def dataset_facts(fields: Mapping[str, str | Sequence[str]], *,
                  remote: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The facts the model needs, read from the files (local paths, globs,
    s3:// globs or URLs: one header read per object, ranged GETs for remote
    ones): samples, and per field its object sizes."""
    from ._inspect import inspect
    from ._remote import is_remote
    out: dict[str, Any] = {"samples": None, "fields": {}}
    for name, spec in fields.items():
        if isinstance(spec, str):
            if is_remote(spec):
                from . import _npyload, _remote
                cfg = _remote.build(remote, [spec])
                assert cfg is not None
                paths = _npyload.Prefetch.glob(spec, cfg) if any(c in spec for c in "*?[") \
                    else [spec]
            else:
                paths = sorted(_glob.glob(spec))
        else:
            paths = list(spec)
        if not paths:
            raise ValueError(f"model: field {name!r}: nothing matches {spec!r}")
        sizes, probes, samples = [], [], 0
        for p in paths:
            h = inspect(p, remote=remote) if is_remote(p) else inspect(p)
            samples += int(h["shape"][0]) if h["shape"] else 1
            stored = int(h.get("compressed_bytes", h["file_bytes"]))
            # A loader's start reads the first 4 KiB of each object, and the
            # tail (a seek table, a value table) of packed and narrowed
            # ones unless the head held it all.
            tail = ("compressed_bytes" in h or h["descr"] == "|u1") and stored > 4096
            sizes.append(stored)
            probes.append(2 if tail else 1)
        if out["samples"] is None:
            out["samples"] = samples
        elif out["samples"] != samples:
            raise ValueError(f"model: field {name!r} holds {samples} samples, the first "
                             f"field {out['samples']}")
        out["fields"][name] = {"sizes": sizes, "probes": probes}
    return out


def cost_model(*, samples: int, fields: Mapping[str, Mapping[str, Any]], nodes: int = 1,
               ranks_per_node: int = 1, samples_per_s: float = _math.inf,
               batch_size: int = 64, workers: int = 2, cache_bytes: float = 10 << 30,
               shuffle: str = "global", epochs: int = 2, get_rate: float = 5500.0,
               prefixes: int = 1, link: float = 125e6, rtt: float = 0.010,
               server_s: float = 0.0, cache_block: int = 4 << 20,
               request_bytes: int = 32 << 20, inflight: int = 16,
               max_inflight: int = 8,
               local_samples_per_s: float = _math.inf,
               cache_write_bytes_per_s: float = _math.inf) -> dict[str, Any]:
    """The model of this module's docstring. ``fields`` maps a name to
    {"sizes": [stored bytes of each object], "probes": [1 or 2 per object]}
    (``dataset_facts`` reads them from the files), or to {"bytes": D_f,
    "objects": F_f} when only totals are known (objects of equal size).
    ``local_samples_per_s``: what one rank reaches from a warm cache (the
    CPU and the local disk: npyload-bench measures it; default unbounded);
    the model caps every rate at min(samples_per_s, local_samples_per_s).
    ``cache_write_bytes_per_s``: what the cache's disk takes of synced
    writes (every block is written and fdatasync'ed once); it caps the
    node's fetch rate (default unbounded).
    Returns a dict of the predictions (bytes, seconds, requests,
    samples/s; per node unless named ``job_``)."""
    if shuffle not in ("global", "local", "none"):
        raise ValueError(f"model: shuffle must be global, local or none, got {shuffle!r}")
    n, r, N, B = nodes, ranks_per_node, samples, cache_block
    L, T = float(link), rtt + server_s
    Gp = get_rate * prefixes
    lam = min(samples_per_s, local_samples_per_s)
    fl: dict[str, dict[str, Any]] = {}
    for name, f in fields.items():
        if "sizes" in f:
            sizes = [int(x) for x in f["sizes"]]
        else:
            k = int(f["objects"])
            sizes = [int(f["bytes"]) // k] * k
        hs = f.get("probes") or [int(f.get("probes_per_object", 1))] * len(sizes)
        fl[name] = {"sizes": sizes, "D": sum(sizes),
                    "K": sum(_math.ceil(x / B) for x in sizes), "H": sum(hs)}
    D = sum(f["D"] for f in fl.values())
    F = sum(len(f["sizes"]) for f in fl.values())
    K = sum(f["K"] for f in fl.values())
    P = min(D, 0.9 * cache_bytes)
    hc = P / D if D else 1.0

    # 2. Bulk fill, in sample order (the objects interleaved by position).
    order = sorted(((i / len(f["sizes"]), name, sz) for name, f in fl.items()
                    for i, sz in enumerate(f["sizes"])), key=lambda t: (t[0], t[1]))
    left, fill_gets = P, 0
    for _, _, sz in order:
        if left <= 0:
            break
        part = min(sz, left)
        blocks = _math.ceil(part / B)
        per = max(1, request_bytes // B)
        fill_gets += _math.ceil(blocks / per)
        left -= part
    X_f = P / fill_gets if fill_gets else 0.0
    Wd = cache_write_bytes_per_s
    phi_link = min(_phi(L, inflight, X_f, T), Wd)
    phi_gets = Gp * X_f / n if X_f else _math.inf
    phi_f = min(phi_link, phi_gets)
    t_probe = max(_math.ceil(F / _PROBE_CONC) * (T + 4096 / L), n * F / Gp)
    t_warm = t_probe + (P / phi_f if phi_f > 0 else _math.inf)
    fill = {"bytes": P, "requests": F + fill_gets, "mean_get_bytes": X_f,
            "bytes_per_s": phi_f, "time_to_warm_s": t_warm,
            "limited_by": "GET rate" if phi_gets < phi_link else
            "the cache's disk" if phi_link >= Wd else
            ("link" if phi_link > 0.8 * L else "latency (add inflight or request_bytes)"),
            "job_requests_per_s": n * (F + fill_gets) / t_warm if t_warm > 0 else 0.0}

    # 3. On demand, epoch 1.
    per_node = N / n
    for f in fl.values():
        f["m"] = N / f["K"] if f["K"] else _math.inf
        f["u"] = 1 - (1 - 1 / n) ** f["m"] if n > 1 else 1.0
        f["Bf"] = f["D"] / f["K"] if f["K"] else 0.0

    def q(f: dict[str, Any], x: float) -> float:
        if shuffle == "global":
            return float((1 - x / n) ** (f["m"] - 1)) if f["m"] >= 1 else 1.0
        return float(f["K"] * f["u"] / per_node)

    steps = 400
    t1 = 0.0
    for i in range(steps):
        x = (i + 0.5) / steps
        b = sum(f["Bf"] * q(f, x) for f in fl.values())
        g = sum(q(f, x) for f in fl.values())
        if b <= 0:
            S = r * lam
        else:
            O = r * workers * min(max_inflight, batch_size * g)
            S = min(r * lam, min(_phi(L, O, b / g, T), Wd) / b, Gp / (n * g))
        t1 += per_node / steps / S if S > 0 else _math.inf
    bytes1 = sum(f["D"] * f["u"] for f in fl.values())
    probes = r * sum(f["H"] for f in fl.values())
    # Every rank's start probes every object (16 in flight) before epoch 1.
    t1 += max(_math.ceil(probes / r / _PROBE_CONC) * (T + 4096 / L), n * probes / Gp)
    gets1 = sum(f["K"] * f["u"] for f in fl.values()) + probes
    sps1 = per_node / t1 if t1 > 0 else _math.inf
    # Warm when 99 % of the blocks were met: a block is met in e epochs
    # with probability 1 - (1 - 1/n)^(m e).
    m_min = min((f["m"] for f in fl.values()), default=1.0)
    e_warm = 1.0 if n == 1 or shuffle != "global" else \
        max(1.0, _math.log(0.01) / (m_min * _math.log(1 - 1 / n)))
    on_demand = {"epoch1_s": t1, "epoch1_samples_per_s_per_rank": sps1 / r,
                 "epoch1_bytes": bytes1, "epoch1_requests": gets1,
                 "requests_per_sample": gets1 / per_node,
                 "epochs_to_warm": _math.ceil(e_warm) if P >= D else _math.inf,
                 "time_to_warm_s": t1 * _math.ceil(e_warm) if P >= D else _math.inf,
                 "job_requests_per_s": n * gets1 / t1 if t1 > 0 else 0.0}

    # 4. Later epochs (and epoch 1 after a fill).
    if hc >= 1:
        S_ss, bytes_ss, gets_ss = r * lam, 0.0, 0.0
    else:
        bytes_ss = (1 - hc) * bytes1
        gets_ss = (1 - hc) * (gets1 - probes)
        b = bytes_ss / per_node
        g = gets_ss / per_node
        O = r * workers * min(max_inflight, max(batch_size * g, 1e-9))
        S_ss = min(r * lam, min(_phi(L, O, b / g, T), Wd) / b if b > 0 else _math.inf,
                   Gp / (n * g) if g > 0 else _math.inf)
    later = {"bytes_per_epoch": bytes_ss, "requests_per_epoch": gets_ss,
             "samples_per_s_per_rank": S_ss / r if r else 0.0,
             "job_requests_per_s": n * gets_ss * S_ss / per_node if gets_ss else 0.0}
    # Fed: every rank gets its demand (a local ceiling below it is a "no").
    want = samples_per_s
    fed_later = want == _math.inf or later["samples_per_s_per_rank"] >= 0.99 * want
    fed_first = want == _math.inf or on_demand["epoch1_samples_per_s_per_rank"] >= 0.99 * want
    return {
        "dataset": {"samples": N, "bytes": D, "objects": F, "blocks": K,
                    "bytes_per_sample": D / N if N else 0.0},
        "job": {"nodes": n, "ranks_per_node": r, "samples_per_s_per_rank": samples_per_s,
                "local_samples_per_s_per_rank": local_samples_per_s,
                "demand_bytes_per_s_per_node": r * lam * D / N if N else 0.0,
                "cache_bytes": cache_bytes, "cached_part_bytes": P, "cached_fraction": hc,
                "shuffle": shuffle, "epochs": epochs},
        "store": {"get_rate_per_prefix": get_rate, "prefixes": prefixes, "link_bytes_per_s": L,
                  "rtt_s": rtt, "server_s": server_s},
        "fill": fill, "on_demand": on_demand, "later_epochs": later,
        "fed": {"epoch1_on_demand": fed_first, "after_fill_or_epoch1": fed_later},
    }


def _fmt_time(s: float) -> str:
    if s == _math.inf:
        return "never (the cache cannot hold the dataset)"
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _fmt_rate(v: float) -> str:
    if v == _math.inf:
        return "unbounded"
    return f"{v:.1f}" if v < 10 else f"{v:.0f}"


def report(m: dict[str, Any]) -> str:
    """The model's result in words (what npyload-model prints)."""
    d, j, f, o, lt = m["dataset"], m["job"], m["fill"], m["on_demand"], m["later_epochs"]
    lam = j["samples_per_s_per_rank"]
    lines = [
        f"dataset: {d['samples']} samples, {_human(d['bytes'])} stored in {d['objects']} "
        f"objects ({d['blocks']} cache blocks), {_human(d['bytes_per_sample'])}/sample",
        f"job: {j['nodes']} nodes x {j['ranks_per_node']} ranks, "
        + ("as fast as fed" if lam == _math.inf else f"{lam:g} samples/s per rank "
           f"({_human(j['demand_bytes_per_s_per_node'])}/s per node)")
        + f"; cache {_human(j['cache_bytes'])} per node holds "
        f"{j['cached_fraction'] * 100:.0f} % of the dataset",
        "",
        "bulk fill before the job (npyload-prefetch), per node:",
        f"  {_human(f['bytes'])} in {f['requests']} requests "
        f"(mean GET {_human(f['mean_get_bytes'])}), {_human(f['bytes_per_s'])}/s "
        f"(limited by {f['limited_by']})",
        f"  time to a warm cache: {_fmt_time(f['time_to_warm_s'])}; the store sees "
        f"{f['job_requests_per_s']:.0f} GET/s from the job",
        "",
        "on demand (no fill), epoch 1, per node:",
        f"  {_human(o['epoch1_bytes'])} in {o['epoch1_requests']:.0f} requests "
        f"({o['requests_per_sample']:.2f} per sample), "
        f"{_fmt_rate(o['epoch1_samples_per_s_per_rank'])} samples/s per rank, "
        f"{_fmt_time(o['epoch1_s'])}",
        f"  the store sees {o['job_requests_per_s']:.0f} GET/s from the job; warm after "
        f"{_fmt_time(o['time_to_warm_s'])}"
        + (f" ({o['epochs_to_warm']} epochs)" if o["epochs_to_warm"] not in (1, _math.inf)
           else ""),
        "",
        "later epochs (and epoch 1 after a fill), per node:",
        f"  {_human(lt['bytes_per_epoch'])} and {lt['requests_per_epoch']:.0f} requests per "
        f"epoch from the store, {_fmt_rate(lt['samples_per_s_per_rank'])} samples/s per rank"
        + (" (local reads: not modelled)" if lt["bytes_per_epoch"] == 0 else "")
        + f", {lt['job_requests_per_s']:.0f} GET/s at the store",
        "",
        f"fed: epoch 1 on demand {'yes' if m['fed']['epoch1_on_demand'] else 'NO'}, "
        f"after a fill or epoch 1 {'yes' if m['fed']['after_fill_or_epoch1'] else 'NO'}",
    ]
    return "\n".join(lines)


def _rate(s: str) -> float:
    """A rate: 125M (bytes/s), 1Gbit, 10Gbit, 1.2GB."""
    t = s.strip().lower()
    if t.endswith(("bit", "bps")):
        t = t[:-3]
        mult = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
        if t and t[-1] in mult:
            return float(t[:-1]) * mult[t[-1]] / 8
        return float(t) / 8
    return float(_bytes(s))


def main(argv: Sequence[str] | None = None) -> int:
    """``npyload-model``: the command line of the cost model."""
    ap = _argparse.ArgumentParser(
        prog="npyload-model",
        description="Predict what a job reading a dataset from an object store costs: "
                    "requests/s, bytes per node, time to a warm cache, and whether it will "
                    "be fed, with a bulk fill (npyload-prefetch) and on demand. The formulas "
                    "are in the docs (remote.md) and npyload/_model.py.")
    ap.add_argument("fields", nargs="*", metavar="[NAME=]GLOB",
                    help="the dataset's files (local, s3:// or https://): their headers give "
                         "the facts (one read per object)")
    ap.add_argument("--samples", type=int, help="without files: samples in the dataset")
    ap.add_argument("--bytes", type=_bytes, dest="nbytes",
                    help="without files: stored bytes of the dataset (e.g. 22G)")
    ap.add_argument("--objects", type=int, help="without files: objects (equal sizes)")
    ap.add_argument("--packed", action="store_true",
                    help="without files: .npy.zst or narrowed objects (2 probes each)")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--samples-per-s", type=float, default=_math.inf,
                    help="demand per rank (default: as fast as it can be fed)")
    ap.add_argument("--local-samples-per-s", type=float, default=_math.inf,
                    help="what one rank reaches from a warm cache (CPU, local disk; "
                         "npyload-bench measures it); default unbounded")
    ap.add_argument("--cache-write", type=_rate, default=_math.inf,
                    help="the cache disk's synced write rate per node (e.g. 2G); "
                         "default unbounded")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="reading threads per rank")
    ap.add_argument("--cache-bytes", type=_bytes, default=10 << 30, help="per node (10G)")
    ap.add_argument("--cache-block", type=_bytes, default=4 << 20, help="(4M)")
    ap.add_argument("--shuffle", choices=["global", "local", "none"], default="global")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--get-rate", type=float, default=5500.0,
                    help="GET/s the store serves per prefix (S3: 5500)")
    ap.add_argument("--prefixes", type=int, default=1)
    ap.add_argument("--link", type=_rate, default=_rate("10Gbit"),
                    help="per node: 1Gbit, 10Gbit, 125M (bytes/s); default 10Gbit")
    ap.add_argument("--rtt", type=float, default=0.010, help="seconds (0.010)")
    ap.add_argument("--server-ms", type=float, default=15.0,
                    help="the store's time to the first byte (S3: ~15 ms)")
    ap.add_argument("--request-bytes", type=_bytes, default=32 << 20,
                    help="the fill's GET size (32M)")
    ap.add_argument("--inflight", type=int, default=16, help="the fill's GETs in flight")
    ap.add_argument("--max-inflight", type=int, default=8,
                    help="GETs in flight per reading thread (8)")
    ap.add_argument("--json", metavar="FILE", help="also write the prediction ('-': stdout)")
    a = ap.parse_args(argv)
    try:
        if a.fields:
            specs = {}
            for i, f in enumerate(a.fields):
                name, sep, pat = f.partition("=")
                specs[name if sep and "://" not in name else f"field{i}"] = \
                    pat if sep and "://" not in name else f
            facts = dataset_facts(specs)
        elif a.samples and a.nbytes and a.objects:
            facts = {"samples": a.samples, "fields": {"data": {
                "bytes": a.nbytes, "objects": a.objects,
                "probes_per_object": 2 if a.packed else 1}}}
        else:
            ap.error("give the dataset's files, or --samples, --bytes and --objects")
        m = cost_model(samples=facts["samples"], fields=facts["fields"], nodes=a.nodes,
                       ranks_per_node=a.ranks_per_node, samples_per_s=a.samples_per_s,
                       batch_size=a.batch_size, workers=a.workers, cache_bytes=a.cache_bytes,
                       shuffle=a.shuffle, epochs=a.epochs, get_rate=a.get_rate,
                       prefixes=a.prefixes, link=a.link, rtt=a.rtt,
                       server_s=a.server_ms / 1000, cache_block=a.cache_block,
                       request_bytes=a.request_bytes, inflight=a.inflight,
                       max_inflight=a.max_inflight,
                       local_samples_per_s=a.local_samples_per_s,
                       cache_write_bytes_per_s=a.cache_write)
    except (ValueError, OSError) as e:
        _sys.stderr.write(f"npyload-model: {e}\n")
        return 1
    print(report(m))
    if a.json:
        _write_json(a.json, m)
    return 0
