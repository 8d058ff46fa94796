#!/usr/bin/env python3
"""Renders an npyload-bench JSON document (npyload-bench --json) as a heatmap
image with matplotlib: the workers x prefetch grid, one panel per io backend,
coloured by GB/s (or by consumer stall % when the run used --compute-ms),
the recommended configuration framed in red. The same figure that
`npyload-bench --plot FILE.svg` writes, for those who want a PNG (or any
format matplotlib writes, chosen by the file name's extension).

    python3 bench/plot_bench.py bench.json bench.png

matplotlib is optional for npyload (pip install matplotlib); without it this
script says so and exits with status 2.
"""
import argparse
import json
import sys


def grid_values(doc):
    """{io: (workers, prefetch, cells)} where cells[(w, p)] is the run."""
    panels = {}
    for i, r in enumerate(doc["runs"]):
        cells = panels.setdefault(r["io_requested"], {})
        cells[(r["workers"], r["prefetch"])] = (i, r)
    out = {}
    for io, cells in panels.items():
        ws = sorted({w for w, _ in cells})
        ps = sorted({p for _, p in cells})
        out[io] = (ws, ps, cells)
    return out


def draw(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    stall = doc["config"]["compute_ms"] > 0
    key = "stall_pct" if stall else "gbps"
    panels = grid_values(doc)
    ok = [r[key] for r in doc["runs"] if r["ok"]]
    vmin = min(ok) if ok and stall else 0.0
    vmax = max(ok) if ok else 1.0
    rec = doc.get("recommendation")
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(2 + 1.6 * max(len(p[1]) for p in panels.values()),
                                      1.5 + 1.2 * sum(len(p[0]) for p in panels.values())))
    fig.subplots_adjust(bottom=0.22, right=0.85)  # room for the footer line
    cmap = "viridis_r" if stall else "viridis"
    image = None
    for ax, (io, (ws, ps, cells)) in zip(axes[:, 0], panels.items()):
        z = np.full((len(ws), len(ps)), np.nan)
        for (w, p), (_, r) in cells.items():
            if r["ok"]:
                z[ws.index(w), ps.index(p)] = r[key]
        image = ax.imshow(z, origin="lower", cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        for (w, p), (i, r) in cells.items():
            y, x = ws.index(w), ps.index(p)
            text = (f"{r['stall_pct']:.1f}%" if stall else f"{r['gbps']:.2f}") if r["ok"] else "failed"
            r_, g_, b_, _ = image.cmap(image.norm(r[key])) if r["ok"] else (1, 1, 1, 1)
            dark = 0.299 * r_ + 0.587 * g_ + 0.114 * b_ < 0.55
            ax.text(x, y, text, ha="center", va="center", color="white" if dark else "black")
            if rec and rec["run_index"] == i:
                ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False,
                                           edgecolor="#e0102f", linewidth=3))
        ax.set_xticks(range(len(ps)), [str(p) for p in ps])
        ax.set_yticks(range(len(ws)), [str(w) for w in ws])
        ax.set_xlabel("prefetch (batch slots)")
        ax.set_ylabel("workers")
        ax.set_title(f"io = {io}")
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="stall %" if stall else "GB/s")
    fig.suptitle("npyload-bench: " + ("consumer stall %, lower is better" if stall
                                      else "throughput GB/s, higher is better"))
    if rec:
        fig.text(0.01, 0.01, rec["line"], color="#e0102f", fontsize=8)
    fig.savefig(path, dpi=100)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="npyload-bench --json output")
    ap.add_argument("image", help="output image, e.g. bench.png")
    args = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_bench.py: matplotlib is not installed (pip install matplotlib); "
              "npyload-bench --plot FILE.svg needs nothing", file=sys.stderr)
        return 2
    with open(args.json) as f:
        doc = json.load(f)
    if not doc.get("runs"):
        print(f"plot_bench.py: {args.json}: no run to draw", file=sys.stderr)
        return 1
    draw(doc, args.image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
