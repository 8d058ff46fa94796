#!/usr/bin/env bash
# The main job on an embedded default: build, generate a small captcha-shaped
# dataset (8 files x 64 samples: images, heatmaps, offsets), inspect it, load
# it with npyload across a small workers x prefetch grid, and print the
# throughput against the machine's copy ceiling and the recommendation.
#
#   bash bench/demo.sh [extra npyload-bench options]
#
# First installs what is missing for it (scripts/setup-deps.sh demo: a C
# compiler, cmake, pkg-config, libzstd-dev, liburing-dev if it can);
# NPYLOAD_NO_INSTALL=1 only checks. It needs neither Criterion nor Python:
# a new build directory is configured with the tests off.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh demo
B=${NPYLOAD_BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
[[ -f $B/CMakeCache.txt ]] ||
  cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNPYLOAD_BUILD_TESTS=OFF >/dev/null
cmake --build "$B" -j"$(nproc 2>/dev/null || echo 2)" --target npyload-gen npyload-inspect npyload-bench >/dev/null
if grep -q '^NPYLOAD_BUILT_WITH_URING:INTERNAL=ON' "$B/CMakeCache.txt"; then
  echo "demo: io_uring backend compiled in (io=auto probes it at run time and falls back to pread if refused)"
else
  echo "demo: built WITHOUT liburing (liburing-dev not installed): io_uring is compiled out, npyload runs on pread"
fi

DATA=${NPYLOAD_DEMO_DIR:-${TMPDIR:-/tmp}/npyload-demo}
if [[ ! -f $DATA/labels/train/train_0007_offsets.npy ]]; then
  "$B/tools/npyload-gen" --preset captcha --out "$DATA" --files 8 --seed 0
fi
"$B/tools/npyload-inspect" "$DATA/images/train/train_0000.npy" \
  "$DATA/labels/train/train_0000_heatmaps.npy" "$DATA/labels/train/train_0000_offsets.npy"
"$B/tools/npyload-bench" \
  "images=$DATA/images/train/train_*.npy" \
  "heatmaps=$DATA/labels/train/train_*_heatmaps.npy" \
  "offsets=$DATA/labels/train/train_*_offsets.npy" \
  --shuffle --batch-size 128 --json "$DATA/bench.json" --plot "$DATA/bench.svg" "$@"
echo "JSON: $DATA/bench.json  plot: $DATA/bench.svg"
