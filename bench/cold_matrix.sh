#!/usr/bin/env bash
# Issue 28's table: cold epochs of the captcha layout on a throttled disk
# (bench/cold_throttled.sh, root), packed and raw, for several disk speeds:
# the default configuration (2 workers, prefetch 4) with and without
# read-ahead, and a small grid for the best configuration.
#
#   npyload-gen --preset captcha --out PACKED --files 160 && \
#     npyload-pack --rm PACKED/images/train/*.npy PACKED/labels/train/*.npy
#   npyload-gen --preset captcha --out RAW --files 40
#   bash bench/cold_matrix.sh PACKED RAW [RATES...]   (default 200M 400M 1G)
#
# Prints one line per run: rate, data, configuration, samples/s, and the
# share of worker time spent waiting for read-ahead reads.
set -euo pipefail
cd "$(dirname "$0")/.."
packed=${1:?packed dataset dir}
raw=${2:?raw dataset dir}
shift 2
rates=("$@")
[[ ${#rates[@]} -gt 0 ]] || rates=(200000000 400000000 1000000000)
B=${NPYLOAD_BUILD_DIR:-build-rel}
bench=$B/tools/npyload-bench
out=$(mktemp -d)
fields() { # dir ext
  echo "images=$1/images/train/*$2" "heatmaps=$1/labels/train/*_heatmaps$2" \
       "offsets=$1/labels/train/*_offsets$2"
}
run() { # rate label batches dir ext [bench options...]
  local rate=$1 label=$2 batches=$3 dir=$4 ext=$5
  shift 5
  # shellcheck disable=SC2046
  bash bench/cold_throttled.sh "$rate" -- "$bench" $(fields "$dir" "$ext") --shuffle \
      --batch-size 128 --cold --batches "$batches" --json "$out/r.json" --quiet "$@" \
      >/dev/null 2>&1 || { echo "$rate $label: failed"; return; }
  python3 - "$out/r.json" "$rate" "$label" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["runs"]:
    if not r["ok"]:
        continue
    wait = r.get("read_wait_ns", 0) / 1e9 / (r["wall_s"] * r["workers"])
    print(f"{int(sys.argv[2]) / 1e6:6.0f} MB/s  {sys.argv[3]:<22} w={r['workers']} "
          f"p={r['prefetch']}  {r['samples_per_s']:7.0f} samples/s  "
          f"read wait {100 * wait:4.1f}%", flush=True)
PY
}
for rate in "${rates[@]}"; do
  run "$rate" "packed default" 60 "$packed" .npy.zst --workers 2 --prefetch 4
  run "$rate" "packed no read-ahead" 60 "$packed" .npy.zst --workers 2 --prefetch 4 --no-read-ahead
  run "$rate" "packed grid" 60 "$packed" .npy.zst --workers 1,2,3,4 --prefetch 4,8
  run "$rate" "raw default" 12 "$raw" .npy --workers 2 --prefetch 4
  run "$rate" "raw no read-ahead" 12 "$raw" .npy --workers 2 --prefetch 4 --no-read-ahead
done
rm -rf "$out"
