#!/usr/bin/env bash
# Checks what a profile of npyload needs and installs only what is missing:
# Debian packages with apt-get (sudo when not root), Python packages with
# `python -m pip`. Idempotent: when everything is there it installs nothing
# and does not run `apt-get update`.
#
#   bash scripts/setup-deps.sh [demo|test|fuzz|ci]     # check, install the missing
#   source scripts/setup-deps.sh test                   # the same, then export
#                                                       #   NPYLOAD_PYTHON (and PATH
#                                                       #   when a venv was made)
#   NPYLOAD_NO_INSTALL=1 bash scripts/setup-deps.sh ci  # check and report only
#
# Profiles (each includes the one before it, fuzz aside):
#   demo  C compiler, cmake, pkg-config, ninja or make, libzstd-dev;
#         liburing-dev is optional: without it io_uring is compiled out and
#         the loader runs on pread.
#   test  demo + libcriterion-dev, zstd (the CLI), the interpreter's
#         headers (python3.X-dev) and pip: numpy pytest scikit-build-core
#         jsonschema.
#   fuzz  demo + clang and its sanitizer/libFuzzer runtime (libclang-rt-14-dev).
#   ci    test + fuzz + torch==2.13.0 (exactly: any other version pulls
#         gigabytes of CUDA wheels).
#
# Python: the interpreter is $NPYLOAD_PYTHON (default python3). An active
# virtualenv is used as it is. A distribution interpreter that refuses pip
# installs (PEP 668 "externally managed", Debian 12's python3) gets a venv
# at $NPYLOAD_VENV (default build/venv, --system-site-packages so that
# Debian's python3-* packages still count), never --break-system-packages.
#
# Messages go to stderr. Exit status: 0 when everything required is there
# (optional things may be missing, and are reported), 1 otherwise.

# ---- sourced: run the real work in a child, then export its interpreter ----
if [[ ${BASH_SOURCE[0]} != "$0" ]]; then
  _npyload_py=$(bash "${BASH_SOURCE[0]}" --print-python "$@") || return 1
  export NPYLOAD_PYTHON=$_npyload_py
  if [[ -f $(dirname "$_npyload_py")/activate ]]; then
    _npyload_bin=$(dirname "$_npyload_py")
    case ":$PATH:" in *":$_npyload_bin:"*) ;; *) export PATH="$_npyload_bin:$PATH" ;; esac
    export VIRTUAL_ENV=$(dirname "$_npyload_bin")
    unset _npyload_bin
  fi
  unset _npyload_py
  return 0
fi

set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRINT_PY=0
if [[ ${1:-} == --print-python ]]; then PRINT_PY=1; shift; fi
PROFILE=${1:-test}
case $PROFILE in
  demo|test|fuzz|ci) ;;
  *) echo "usage: $0 [demo|test|fuzz|ci]" >&2; exit 2 ;;
esac
NO_INSTALL=${NPYLOAD_NO_INSTALL:-0}
[[ $NO_INSTALL == 0 || -z $NO_INSTALL ]] && NO_INSTALL=0 || NO_INSTALL=1
say() { echo "setup-deps ($PROFILE): $*" >&2; }

wants() {  # wants PROFILE...: is the current profile one of these (or above)?
  local p
  for p; do
    case $p:$PROFILE in
      demo:*|test:test|test:ci|fuzz:fuzz|fuzz:ci|ci:ci) return 0 ;;
    esac
  done
  return 1
}

have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_deb() {
  have_cmd dpkg-query &&
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'
}
have_pc() {  # have_pc MODULE DEBPKG: pkg-config first, dpkg when pkg-config is absent
  if have_cmd pkg-config; then pkg-config --exists "$1"; else have_deb "$2"; fi
}

# ---- what is missing --------------------------------------------------------
# Each check appends "deb-package|required|what" to MISSING.
MISSING=()
need() { MISSING+=("$1|$2|$3"); }

check_debs() {
  MISSING=()
  if ! have_cmd cc && ! have_cmd gcc; then need gcc required "a C compiler"; fi
  if have_cmd dpkg-query && ! have_deb libc6-dev; then need libc6-dev required "the C library headers"; fi
  have_cmd cmake || need cmake required "cmake"
  have_cmd pkg-config || need pkg-config required "pkg-config"
  if ! have_cmd ninja && ! have_cmd make; then need ninja-build required "a build tool (ninja or make)"; fi
  have_pc libzstd libzstd-dev || need libzstd-dev required "libzstd"
  have_pc liburing liburing-dev ||
    need liburing-dev optional "liburing: io_uring will be compiled out and npyload will run on pread"
  if wants test; then
    have_pc criterion libcriterion-dev || need libcriterion-dev required "Criterion (C tests)"
    have_cmd zstd || need zstd required "the zstd command"
  fi
  if wants fuzz; then
    if ! have_cmd clang; then
      need clang required "clang (fuzzer)"
      need libclang-rt-14-dev required "clang's sanitizer and libFuzzer runtime"
    else
      local v
      v=$(clang -dumpversion 2>/dev/null); v=${v%%.*}
      have_deb "libclang-rt-$v-dev" ||
        need "libclang-rt-$v-dev" required "clang's sanitizer and libFuzzer runtime"
    fi
  fi
  if wants test && [[ -n ${PY_VER:-} ]]; then
    [[ $PY_HEADERS == 1 ]] || need "python$PY_VER-dev" required "Python.h for $PY ($PY_INC)"
    if [[ $PY_NEEDS_VENV == 1 ]] && ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
      need "python$PY_VER-venv" required "venv/ensurepip for $PY"
    elif [[ $PY_NEEDS_VENV == 1 ]] && have_cmd dpkg-query && [[ $PY == /usr/* ]] &&
         ! have_deb "python$PY_VER-venv"; then
      need "python$PY_VER-venv" required "venv/ensurepip for $PY"
    fi
    if [[ $PY_NEEDS_VENV == 0 ]] && ! "$PY" -m pip --version >/dev/null 2>&1; then
      need python3-pip required "pip for $PY"
    fi
  fi
}

# ---- Python facts (test and ci) --------------------------------------------
PY=""
PY_VER=""
python_facts() {
  PY=${NPYLOAD_PYTHON:-python3}
  if ! have_cmd "$PY"; then say "no Python interpreter '$PY'"; PY_VER=""; return 1; fi
  PY=$(command -v "$PY")
  local facts
  facts=$("$PY" - <<'EOF'
import os, sys, sysconfig
inc = sysconfig.get_paths()["include"]
venv = sys.prefix != sys.base_prefix
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
print("%d.%d" % sys.version_info[:2])
print(int(os.path.exists(os.path.join(inc, "Python.h"))))
print(inc)
print(int(managed and not venv))
EOF
) || { say "$PY does not run"; return 1; }
  { read -r PY_VER; read -r PY_HEADERS; read -r PY_INC; read -r PY_NEEDS_VENV; } <<<"$facts"
}

# The pip requirements of the profile; prints those not satisfied.
pip_missing() {
  "$1" - "${PIP_REQS[@]}" <<'EOF'
import re, sys
from importlib import metadata
def key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])
out = []
for req in sys.argv[1:]:
    name, op, want = re.match(r"([A-Za-z0-9_.-]+)\s*(==|>=)?\s*(\S*)", req).groups()
    have = None
    for n in (name, name.replace("-", "_")):
        try:
            have = metadata.version(n)
            break
        except metadata.PackageNotFoundError:
            pass
    if (have is None or (op == "==" and have.split("+")[0] != want)
            or (op == ">=" and key(have) < key(want))):
        out.append(req)
print(" ".join(out))
EOF
}

PIP_REQS=()
wants test && PIP_REQS+=(numpy pytest "scikit-build-core>=0.10" jsonschema)
wants ci && PIP_REQS+=(torch==2.13.0)

if wants test; then python_facts || exit 1; fi

# ---- Debian packages ----------------------------------------------------------
check_debs
if ((${#MISSING[@]})); then
  pkgs=() req=()
  for m in "${MISSING[@]}"; do
    IFS='|' read -r p r what <<<"$m"
    say "missing: $what  [Debian: $p, $r]"
    pkgs+=("$p"); [[ $r == required ]] && req+=("$p")
  done
  if [[ $NO_INSTALL == 1 ]]; then
    say "NPYLOAD_NO_INSTALL is set: not installing; to install: apt-get install ${pkgs[*]}"
  elif ! have_cmd apt-get; then
    say "no apt-get here: install the packages above with your system's package manager"
  else
    SUDO=()
    if [[ $(id -u) != 0 ]]; then
      if have_cmd sudo; then SUDO=(sudo); else
        say "not root and no sudo: cannot install; as root run: apt-get install ${pkgs[*]}"
        SUDO=(false)
      fi
    fi
    if [[ ${SUDO[*]-} != false ]]; then
      log=$(mktemp "${TMPDIR:-/tmp}/npyload-apt.XXXXXX")
      apt_quiet() {  # apt_quiet ARGS...: quiet, the log's tail on failure
        if "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -qq "$@" >"$log" 2>&1; then
          return 0
        fi
        tail -n 15 "$log" >&2; return 1
      }
      say "apt-get update, then install: ${pkgs[*]}"
      if apt_quiet update; then
        if ! apt_quiet install --no-install-recommends "${pkgs[@]}" &&
           ((${#req[@]} < ${#pkgs[@]})) && ((${#req[@]})); then
          say "retrying without the optional packages"
          apt_quiet install --no-install-recommends "${req[@]}"
        fi
      else
        say "apt-get update failed"
      fi
      rm -f "$log"
    fi
  fi
  hash -r
  wants test && python_facts
  check_debs
fi

fail=0 rmiss=()
for m in "${MISSING[@]}"; do
  IFS='|' read -r p r what <<<"$m"
  if [[ $r == required ]]; then rmiss+=("$p"); else say "note: optional, not installed: $what"; fi
done
if ((${#rmiss[@]})); then
  say "ERROR: required Debian packages missing: ${rmiss[*]}"; fail=1
fi

# ---- Python packages --------------------------------------------------------
if wants test && [[ $fail == 0 ]]; then
  export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
  if [[ $PY_NEEDS_VENV == 1 ]]; then
    VENV=${NPYLOAD_VENV:-$ROOT/build/venv}
    if [[ ! -x $VENV/bin/python ]]; then
      if [[ $NO_INSTALL == 1 ]]; then
        say "$PY is externally managed (PEP 668); would create a venv at $VENV"
      else
        say "$PY is externally managed (PEP 668): creating a venv at $VENV (--system-site-packages)"
        mkdir -p "$(dirname "$VENV")"
        "$PY" -m venv --system-site-packages "$VENV" >&2 || { say "ERROR: python -m venv $VENV failed"; fail=1; }
      fi
    fi
    [[ -x $VENV/bin/python ]] && PY=$VENV/bin/python
  fi
  if [[ $fail == 0 ]]; then
    read -r -a pmiss <<<"$(pip_missing "$PY")"
    if ((${#pmiss[@]})); then
      if [[ $NO_INSTALL == 1 ]]; then
        say "missing pip packages for $PY: ${pmiss[*]} (NPYLOAD_NO_INSTALL is set: not installing)"
        fail=1
      else
        say "pip install (into $PY): ${pmiss[*]}"
        "$PY" -m pip install -q "${pmiss[@]}" >&2 || say "pip install failed"
        read -r -a pmiss <<<"$(pip_missing "$PY")"
        if ((${#pmiss[@]})); then say "ERROR: still missing pip packages: ${pmiss[*]}"; fail=1; fi
      fi
    fi
  fi
fi

if [[ $fail == 0 ]]; then
  say "ready${PY:+ (python: $PY)}"
else
  say "not ready: see the errors above"
fi
[[ $PRINT_PY == 1 && $fail == 0 ]] && echo "${PY:-python3}"
exit $fail
