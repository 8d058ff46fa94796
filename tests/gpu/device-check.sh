#!/usr/bin/env bash
# Every GPU check of npyload in one command, for a machine with an NVIDIA GPU:
#
#   bash tests/gpu/device-check.sh OUTDIR
#
# Builds in Release with CUDA (its own build directory, build-device-check/),
# generates captcha data, then runs, within about 8 minutes:
#   1. test_gpu and test_cuda (Criterion);
#   2. compute-sanitizer memcheck, racecheck and synccheck on test_gpu and on a
#      short device-mode npyload-bench run, memcheck on the loader's
#      augmentation and narrowed-code kernels (test_gpu_transform);
#   3. the H2D ratio: npyload-bench --device cuda:0 (the loader's delivered
#      GB/s against pinned cudaMemcpyAsync of the same batch bytes, measured
#      in the same run), with NVML samples;
#   4. the stall with a GPU busy step longer than the copy
#      (npyload-bench --device cuda:0 --compute-ms X, X from step 3);
#   5. the Python package with CUDA torch (tests/gpu/test_gpu_python.py), and
#      the bytes that cross PCIe per batch on the captcha data with kernels
#      after the copy: augmentation and narrowed codes (tests/gpu/h2d_bytes.py);
#   6. torch DataLoader (pin_memory=True, .to(device, non_blocking=True))
#      against npyload on the same files (bench/gpu_torch_compare.py).
# Writes OUTDIR/report.json and OUTDIR/report.md (figures, verdicts against
# the targets H2D >= 0.9, stall < 5 %, sanitizers 0 errors; the device and
# the driver) and OUTDIR/logs/; exits non-zero when any check failed.
#
# No pip download ever happens (the GPU machine may have no network): the
# package is installed with --no-build-isolation --no-deps --no-index into a
# venv that sees the system's torch; without scikit-build-core the extension
# is built with CMake directly and put on PYTHONPATH.
#
# Without a GPU (no nvidia-smi, or no device answering) it says so, checks
# its own syntax (bash -n, py_compile of its Python helpers) and exits 0.
# NPYLOAD_DEVICE_CHECK_ASSUME_NO_GPU=1 forces that path (the CI test);
# NPYLOAD_DEVICE_CHECK_CMAKE_PY=1 forces the CMake build of the extension.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-}
if [[ -z $OUT || $OUT == -h || $OUT == --help ]]; then
  sed -n '2,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  [[ -z $OUT ]] && exit 2 || exit 0
fi
mkdir -p "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
HELPERS=("$HERE/device_check_report.py" "$HERE/test_gpu_python.py" "$HERE/h2d_bytes.py"
         "$REPO/bench/gpu_torch_compare.py" "$REPO/bench/torch_compare.py")

say() { printf 'device-check: %s\n' "$*"; }

# ---- syntax, always ----
bash -n "${BASH_SOURCE[0]}" || { say "bash -n failed on $0"; exit 1; }
for f in "${HELPERS[@]}"; do
  # what py_compile does, without writing a .pyc into the tree
  "$PY" -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' "$f" \
    || { say "py_compile failed: $f"; exit 1; }
done

# ---- is there a GPU? ----
nogpu=""
if [[ ${NPYLOAD_DEVICE_CHECK_ASSUME_NO_GPU:-0} == 1 ]]; then
  nogpu="NPYLOAD_DEVICE_CHECK_ASSUME_NO_GPU=1"
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  nogpu="nvidia-smi not found"
elif ! nvidia-smi -L >"$OUT/logs/nvidia-smi.log" 2>&1 || ! grep -q '^GPU ' "$OUT/logs/nvidia-smi.log"; then
  nogpu="nvidia-smi answers no device: $(head -c 300 "$OUT/logs/nvidia-smi.log" | tr '\n' ' ')"
fi
if [[ -n $nogpu ]]; then
  say "no GPU here ($nogpu): nothing measured; syntax of the script and its helpers is OK"
  printf '{"gpu": false, "reason": %s, "checks": [], "ok": true}\n' \
    "$("$PY" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$nogpu")" > "$OUT/report.json"
  printf '# npyload device check\n\nNo GPU: %s. Nothing was measured.\n' "$nogpu" > "$OUT/report.md"
  exit 0
fi

T0=$(date +%s)
STEPS="$OUT/steps.tsv"
: > "$STEPS"
# step NAME TIMEOUT_S CMD...: runs CMD with a time limit, logs to logs/NAME.log,
# records "NAME rc seconds" in steps.tsv.
BUDGET=${NPYLOAD_DEVICE_CHECK_BUDGET_S:-470}
SAN_LEFT=7   # sanitizer runs still to come
# share MAX: sets SHARE, a sanitizer run's limit: its share of the time
# left, at most MAX.
share() {
  local left=$(( BUDGET - ($(date +%s) - T0) )) n=$SAN_LEFT
  SAN_LEFT=$(( SAN_LEFT > 1 ? SAN_LEFT - 1 : 1 ))
  SHARE=$(( left / n ))
  (( SHARE > $1 )) && SHARE=$1
  (( SHARE < 0 )) && SHARE=0
  return 0
}
step() {
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  local left=$(( BUDGET - (t - T0) ))
  (( limit > left )) && limit=$left
  if (( limit < 10 )); then
    say "[$(( t - T0 ))s] $name: skipped, the ${BUDGET}s budget is spent"
    printf '%s\t%d\t0\tskipped: time budget spent\n' "$name" 124 >> "$STEPS"
    return 124
  fi
  say "[$(( t - T0 ))s] $name"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  printf '%s\t%d\t%d\n' "$name" "$rc" "$(( $(date +%s) - t ))" >> "$STEPS"
  [[ $rc -ne 0 ]] && say "  $name: exit $rc (see logs/$name.log)"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,pcie.link.gen.max,pcie.link.width.max \
  --format=csv,noheader -i 0 > "$OUT/gpu.csv" 2>/dev/null || true
say "GPU 0: $(cat "$OUT/gpu.csv")"
NCPU=$(nproc)

# ---- 1. build (Release, CUDA) ----
B="$REPO/build-device-check"
GEN=(); command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
step configure 180 cmake -S "$REPO" -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DNPYLOAD_GPU_TESTS=ON -DNPYLOAD_BUILD_TESTS=ON -DNPYLOAD_BUILD_TOOLS=ON
step build 300 cmake --build "$B" -j"$NCPU" --target test_gpu test_cuda test_gpu_transform \
  npyload-bench npyload-gen
if [[ ! -x $B/tools/npyload-bench || ! -x $B/tests/test_gpu ]]; then
  say "build failed: see $OUT/logs/build.log"
  "$PY" "$HERE/device_check_report.py" report "$OUT"
  exit 1
fi

# ---- data: 16 captcha files (1024 samples, ~1.2 GiB), in the page cache ----
DATA="$OUT/data"
step gen 120 "$B/tools/npyload-gen" --preset captcha --out "$DATA" --files 16
FIELDS=("images=$DATA/images/train/train_*.npy"
        "heatmaps=$DATA/labels/train/train_*_heatmaps.npy"
        "offsets=$DATA/labels/train/train_*_offsets.npy")
SMALL=("images=$DATA/images/train/train_000[01].npy"
       "heatmaps=$DATA/labels/train/train_000[01]_heatmaps.npy"
       "offsets=$DATA/labels/train/train_000[01]_offsets.npy")

# ---- 2. tests ----
step test_gpu 180 "$B/tests/test_gpu" --jobs=1 --verbose
step test_cuda 120 "$B/tests/test_cuda" --jobs=1 --verbose
# Device transforms against the host, on the fatbin and on NVRTC's kernels:
# conversions, augmentation (pad, crop, flips, signs) and narrowed codes,
# kernels and the loader (with the H2D bytes of each case in the log).
step test_gpu_transform 120 "$B/tests/test_gpu_transform" --jobs=1 --verbose
step test_gpu_transform_nvrtc 180 env NPYLOAD_TEST_DEVICE_KERNELS=nvrtc \
  "$B/tests/test_gpu_transform" --jobs=1 --verbose

# ---- 3. H2D ratio (and NVML) ----
W=$(( NCPU >= 16 ? 8 : (NCPU >= 4 ? NCPU / 2 : 1) ))
WLIST=$(printf '%s\n' 2 4 "$W" | sort -nu | paste -sd, -)
step bench_h2d 150 "$B/tools/npyload-bench" "${FIELDS[@]}" --device cuda:0 \
  --workers "$WLIST" --prefetch 2,4 --seconds 2 --json "$OUT/bench_h2d.json"

# ---- 4. stall with a GPU step longer than the copy ----
if [[ -s $OUT/bench_h2d.json ]]; then
  read -r X BW BP < <("$PY" "$HERE/device_check_report.py" compute-ms "$OUT/bench_h2d.json")
  say "  busy step: ${X} ms per batch (workers $BW, prefetch $BP)"
  step bench_stall 120 "$B/tools/npyload-bench" "${FIELDS[@]}" --device cuda:0 \
    --workers "$BW" --prefetch "$BP" --compute-ms "$X" --seconds 4 --json "$OUT/bench_stall.json"
fi

# ---- 5. Python with CUDA torch ----
PYENV=()
if [[ ${NPYLOAD_DEVICE_CHECK_CMAKE_PY:-0} != 1 ]] && "$PY" -c 'import scikit_build_core' >/dev/null 2>&1; then
  V="$OUT/venv"
  step py_venv 60 "$PY" -m venv --system-site-packages "$V"
  step py_install 240 "$V/bin/python" -m pip install --no-build-isolation --no-deps \
    --no-index --ignore-installed "$REPO"
  PYX="$V/bin/python"
else
  # No scikit-build-core (and no network to fetch it): the extension through
  # CMake, the package's Python files beside it, on PYTHONPATH.
  PB="$REPO/build-device-check-py"
  STAGE="$OUT/pystage"
  step py_install 240 bash -c "cmake -S '$REPO' -B '$PB' ${GEN[*]} -DCMAKE_BUILD_TYPE=Release \
      -DNPYLOAD_BUILD_PYTHON=ON -DNPYLOAD_BUILD_TESTS=OFF -DNPYLOAD_BUILD_TOOLS=OFF \
      -DNPYLOAD_GPU_TESTS=OFF -DPython_EXECUTABLE=\$(command -v $PY) && \
    cmake --build '$PB' -j$NCPU --target _npyload && rm -rf '$STAGE' && mkdir -p '$STAGE' && \
    cp -r '$REPO/python_bindings/npyload' '$STAGE/' && \
    cp '$PB'/python_bindings/_npyload*.so '$STAGE/npyload/'"
  PYENV=(env "PYTHONPATH=$STAGE")
  PYX=$PY
  printf 'py_install_mode\t0\t0\tcmake (scikit-build-core absent)\n' >> "$STEPS"
fi
step py_tests 180 "${PYENV[@]}" "$PYX" -m pytest -v -p no:cacheprovider \
  --junitxml="$OUT/pytest.xml" "$HERE/test_gpu_python.py"
# Bytes on PCIe per batch with kernels after the copy, captcha images:
# augmented (stored float32 + records) and narrowed (one-byte codes).
step h2d_bytes 120 "${PYENV[@]}" "$PYX" "$HERE/h2d_bytes.py" --data "$DATA" \
  --out "$OUT/narrowed" --json "$OUT/h2d_bytes.json"

# ---- 6. torch DataLoader (pin_memory + non_blocking) vs npyload ----
step torch_compare 150 "${PYENV[@]}" "$PYX" "$REPO/bench/gpu_torch_compare.py" --data "$DATA" \
  --seconds 4 --workers "$(printf '%s\n' 2 "$W" | sort -nu | paste -sd, -)" --json "$OUT/torch_compare.json"

# ---- 7. compute-sanitizer, last, in the time left ----
# The overlap test's timing claim means nothing 10-100x slower; the tests
# kept are the ones that exercise the loader's device memory.
CS=$(command -v compute-sanitizer || true)
for c in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
         "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
  [[ -z $CS && -x $c ]] && CS=$c
done
if [[ -n $CS ]]; then
  for tool in memcheck racecheck synccheck; do
    extra=(); [[ $tool == memcheck ]] && extra=(--leak-check full)
    share 120
    step "sanitizer_${tool}_test_gpu" "$SHARE" "$CS" --tool "$tool" "${extra[@]}" --error-exitcode 1 \
      --target-processes all "$B/tests/test_gpu" --jobs=1 \
      --filter='gpu/@(device_bytes_equal_file_bytes|no_overwrite_under_slow_consumer|device_batch_outlives_loader)'
    share 60
    step "sanitizer_${tool}_bench" "$SHARE" "$CS" --tool "$tool" "${extra[@]}" --error-exitcode 1 \
      "$B/tools/npyload-bench" "${SMALL[@]}" --device cuda:0 --workers 2 --prefetch 2 \
      --batches 3 --compute-ms 2 --quiet
    # The npyl_tkx_* kernels read per-row records and narrowed value tables
    # through device pointers that neither test_gpu nor the bench uses: an
    # out-of-bounds index there shows only under memcheck (they use no
    # shared memory or barriers, so racecheck and synccheck add nothing).
    if [[ $tool == memcheck ]]; then
      share 90
      step sanitizer_memcheck_transform "$SHARE" "$CS" --tool memcheck --error-exitcode 1 \
        --target-processes all "$B/tests/test_gpu_transform" --jobs=1 \
        --filter='gpu_transform/loader_device_@(augments_like_host|expands_narrowed_like_host)'
    fi
  done
else
  printf 'sanitizer_missing\t127\t0\n' >> "$STEPS"
  say "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
fi

printf 'total\t0\t%d\n' "$(( $(date +%s) - T0 ))" >> "$STEPS"
"$PY" "$HERE/device_check_report.py" report "$OUT"
rc=$?
say "report: $OUT/report.md (exit $rc)"
exit $rc
