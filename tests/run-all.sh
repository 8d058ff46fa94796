#!/usr/bin/env bash
# Runs every test of npyload: the C tests (Criterion, through ctest), the
# stress driver, and the Python tests (pytest, against `pip install .`).
#
#   bash tests/run-all.sh                     # everything (the README's command)
#   bash tests/run-all.sh --sanitize address  # C tests under ASan+UBSan
#   bash tests/run-all.sh --sanitize thread   # concurrency stress under TSan
#   bash tests/run-all.sh --fuzz SECONDS      # the header and seek-table fuzzers, briefly
#
# First installs what is missing (`bash scripts/setup-deps.sh test`, or
# "fuzz" for --fuzz: the Debian packages of scripts/debian-packages.txt with
# apt-get, the "test" extra of pyproject.toml into the interpreter, or into
# build/venv when that interpreter is externally managed, PEP 668), then
# sources it, which only checks. NPYLOAD_NO_INSTALL=1 only checks.
# torch==2.13.0 is not installed here (CI does it); the torch comparisons
# skip visibly without it.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)

mode=all
arg=""
case "${1:-}" in
  --sanitize) mode=sanitize; arg=${2:?address or thread} ;;
  --fuzz) mode=fuzz; arg=${2:-60} ;;
  "") ;;
  *) echo "usage: $0 [--sanitize address|thread | --fuzz SECONDS]" >&2; exit 2 ;;
esac

# Install what is missing (a visible step; NPYLOAD_NO_INSTALL=1 only checks),
# then source the set-up, which only checks and exports NPYLOAD_PYTHON.
profile=test
[[ $mode == fuzz ]] && profile=fuzz
bash scripts/setup-deps.sh "$profile"
source scripts/setup-deps.sh "$profile"
PY=${NPYLOAD_PYTHON:-python3}

if [[ $mode == sanitize ]]; then
  B=build-$arg
  cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Debug -DNPYLOAD_SANITIZE="$arg" \
        -DNPYLOAD_BUILD_TESTS=ON -DNPYLOAD_GPU_TESTS=OFF -DNPYLOAD_CUDA_KERNELS=NVRTC
  cmake --build "$B" -j"$JOBS"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp
  if [[ $arg == thread ]]; then
    # Criterion itself cannot start under TSan (Snaipe/Criterion#274); the
    # stress driver covers the loader's concurrent paths without it.
    ctest --test-dir "$B" --output-on-failure --no-tests=error -R '^stress_'
  else
    ctest --test-dir "$B" --output-on-failure --no-tests=error
  fi
  exit 0
fi

if [[ $mode == fuzz ]]; then
  B=build-fuzz
  CC=clang cmake -S . -B "$B" "${GEN[@]}" -DNPYLOAD_FUZZ=ON -DNPYLOAD_BUILD_TESTS=OFF \
        -DNPYLOAD_BUILD_TOOLS=OFF -DNPYLOAD_GPU_TESTS=OFF -DNPYLOAD_CUDA_KERNELS=OFF
  cmake --build "$B" -j"$JOBS" --target fuzz_header fuzz_seektable
  # The time is split between the two targets.
  half=$(( (arg + 1) / 2 ))
  mkdir -p "$B/corpus" "$B/corpus_seektable"
  cp tests/fuzz/corpus/* "$B/corpus/" 2>/dev/null || true
  cp tests/fuzz/corpus_seektable/* "$B/corpus_seektable/" 2>/dev/null || true
  "$B/tests/fuzz_header" -max_total_time="$half" -print_final_stats=1 "$B/corpus" 2>&1 | tail -25
  echo "fuzz_header: no crash in ${half}s"
  "$B/tests/fuzz_seektable" -max_total_time="$half" -print_final_stats=1 "$B/corpus_seektable" 2>&1 | tail -25
  echo "fuzz_seektable: no crash in ${half}s"
  exit 0
fi

B=${NPYLOAD_BUILD_DIR:-build}
# Tests ON explicitly: bench/demo.sh may have configured this directory
# without them.
cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNPYLOAD_BUILD_TESTS=ON
if ! grep -q '^NPYLOAD_BUILT_WITH_CRITERION:INTERNAL=ON' "$B/CMakeCache.txt"; then
  echo "run-all: CMake did not find Criterion, so the C tests would not run: that is a failure" >&2
  exit 1
fi
cmake --build "$B" -j"$JOBS"
# No tests found (Criterion missing, a glob gone wrong) is a failure.
ctest --test-dir "$B" --output-on-failure --no-tests=error
# GPU tests skip visibly without a device; show their verdicts.
if [[ -x "$B/tests/test_gpu" ]]; then
  "$B/tests/test_gpu" --verbose 2>&1 | grep -E "SKIP|PASS|FAIL|Synthesis" | head -20 || true
fi

# The install as users get it: cmake --install, then downstream programs
# through find_package and pkg-config, shared and static (tests/install/run.sh).
bash tests/install/run.sh "$B"

# Without build isolation when scikit-build-core is already here (offline,
# fast); otherwise pip fetches it into an isolated build environment.
ISO=()
"$PY" -c "import scikit_build_core" 2>/dev/null && ISO=(--no-build-isolation)
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q "${ISO[@]}" .
set +e
NPYLOAD_BUILD_DIR="$B" "$PY" -m pytest -q tests/python
rc=$?
set -e
if [[ $rc == 5 ]]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $rc
