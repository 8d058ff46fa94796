#!/usr/bin/env bash
# The small-rows sweep of bench/README.md ("Small rows"): for each row size,
# a uint8 field of that many bytes per sample plus an int64 label, 6 files,
# in the page cache; npyload-bench with every io backend, 2 workers, a full
# shuffle; then one table: samples/s and the fraction of the gather_copy
# ceiling and of the best ceiling (the higher of pread_copy and gather_copy)
# measured in the same run.
#
#   bash bench/small_rows_sweep.sh [BUILD_DIR] [OUT_DIR]
#
# Environment: SIZES (bytes, default "64 1024 3072 65536 1048576 4194304"),
# DATA_MIB (MiB of data per size, default 512), SECONDS_PER_RUN (1),
# WORKERS (2), IO (io_uring,pread,mmap). The datasets are written under
# OUT_DIR (default /tmp/npyload-sweep) and removed at the end unless KEEP=1.
set -euo pipefail
B=${1:-build}
OUT=${2:-/tmp/npyload-sweep}
SIZES=${SIZES:-"64 1024 3072 65536 1048576 4194304"}
DATA_MIB=${DATA_MIB:-512}
SECS=${SECONDS_PER_RUN:-1}
WORKERS=${WORKERS:-2}
IO=${IO:-io_uring,pread,mmap}
GEN="$B/tools/npyload-gen"
BENCH="$B/tools/npyload-bench"
[[ -x $GEN && -x $BENCH ]] || { echo "build $GEN and $BENCH first" >&2; exit 2; }
mkdir -p "$OUT"
for row in $SIZES; do
  d="$OUT/r$row"
  n=$(( DATA_MIB * 1048576 / row ))
  per=$(( (n + 5) / 6 ))
  # batch: 256 samples, at most 64 MiB of batch
  bs=$(( 67108864 / row )); (( bs > 256 )) && bs=256; (( bs < 1 )) && bs=1
  if [[ ! -f $d/x_0005.npy ]]; then
    "$GEN" --generic --out "$d" --prefix x --shape "$row" --dtype '|u1' --files 6 \
      --samples-per-file "$per" --quiet
    "$GEN" --generic --out "$d" --prefix y --shape '' --dtype '<i8' --files 6 \
      --samples-per-file "$per" --quiet
  fi
  "$BENCH" "x=$d/x_*.npy" "y=$d/y_*.npy" --batch-size "$bs" --shuffle \
    --workers "$WORKERS" --prefetch 4 --io "$IO" --seconds "$SECS" \
    --json "$OUT/r$row.json" --quiet
done
python3 - "$OUT" $SIZES <<'PY'
import json, sys
out, sizes = sys.argv[1], sys.argv[2:]
def h(n):
    n = int(n)
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"
print("| row | batch | pread_copy GB/s | gather_copy GB/s | io | samples/s | GB/s "
      "| of gather_copy | of best ceiling | gathered requests |")
print("|---|---|---|---|---|---|---|---|---|---|")
for s in sizes:
    j = json.load(open(f"{out}/r{s}.json"))
    ce = {c["name"]: c["gbps"] or 0 for c in j["ceilings"] if c["measured"]}
    best = max(ce.get("pread_copy", 0), ce.get("gather_copy", 0))
    for r in j["runs"]:
        if not r["ok"]:
            print(f"| {h(s)} | | | | {r['io_requested']} | failed: {r['error']} |")
            continue
        g = ce.get("gather_copy", 0)
        nreq = r.get("gather_requests", 0) + r.get("read_requests", 0)
        gp = 100 * r.get("gather_requests", 0) / max(1, nreq)
        print(f"| {h(s)} | {j['config']['batch_size']} | {ce.get('pread_copy', 0):.2f} "
              f"| {g:.2f} | {r['io_used']} | {r['samples_per_s']:,.0f} | {r['gbps']:.2f} "
              f"| {r['gbps'] / g if g else float('nan'):.2f} "
              f"| {r['gbps'] / best if best else float('nan'):.2f} | {gp:.0f} % |")
PY
[[ ${KEEP:-0} == 1 ]] || rm -rf "$OUT"/r*/
