#!/usr/bin/env bash
# Checks what a profile of npyload needs and installs only what is missing:
# Debian packages with apt-get (sudo when not root), Python packages with
# `python -m pip`. Idempotent: when everything is there it installs nothing
# and does not run `apt-get update`.
#
#   bash scripts/setup-deps.sh [demo|test|fuzz|docs|ci] # check, install the missing
#   source scripts/setup-deps.sh test                   # check only (never installs),
#                                                       #   then export NPYLOAD_PYTHON
#                                                       #   (and PATH for a venv)
#   NPYLOAD_NO_INSTALL=1 bash scripts/setup-deps.sh ci  # check and report only
#
# What each profile needs is declared once: Debian packages in
# scripts/debian-packages.txt (read only by this script), Python packages in
# pyproject.toml's extras ("test"; "docs"; "ci" adds torch==2.13.0, exactly:
# any other version pulls gigabytes of CUDA wheels). Profiles: demo (build
# and run the bench), test (demo + the C and Python tests), fuzz (demo +
# clang's sanitizer and libFuzzer runtime), docs (test + the "docs" extra +
# Chromium, scripts/build-docs.sh), ci (test + fuzz + docs + the "ci" extra).
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
  # Sourced (the test scripts do, after running it): check only, so that
  # merely sourcing never installs anything.
  _npyload_py=$(NPYLOAD_NO_INSTALL=1 bash "${BASH_SOURCE[0]}" --print-python "$@") || return 1
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
  demo|test|fuzz|docs|ci) ;;
  *) echo "usage: $0 [demo|test|fuzz|docs|ci]" >&2; exit 2 ;;
esac
NO_INSTALL=${NPYLOAD_NO_INSTALL:-0}
[[ $NO_INSTALL == 0 || -z $NO_INSTALL ]] && NO_INSTALL=0 || NO_INSTALL=1
say() { echo "setup-deps ($PROFILE): $*" >&2; }

wants() {  # wants PROFILE...: is the current profile one of these (or above)?
  local p
  for p; do
    case $p:$PROFILE in
      demo:*|test:test|test:docs|test:ci|fuzz:fuzz|fuzz:ci|docs:docs|docs:ci|ci:ci) return 0 ;;
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

PKG_LIST=$ROOT/scripts/debian-packages.txt
check_debs() {
  MISSING=()
  local prof req check pkg what v c ok
  while read -r prof req check pkg what; do
    [[ -z $prof || $prof == \#* ]] && continue
    wants "$prof" || continue
    pkg=${pkg//\{py\}/$PY_VER}
    if [[ $pkg == *'{clang}'* ]]; then
      v=$(clang -dumpversion 2>/dev/null); v=${v%%.*}
      pkg=${pkg//\{clang\}/${v:-14}}
    fi
    case $check in
      cmd:*)
        ok=0
        IFS='|' read -r -a cmds <<<"${check#cmd:}"
        for c in "${cmds[@]}"; do have_cmd "$c" && ok=1; done
        ((ok)) && continue ;;
      pc:*) have_pc "${check#pc:}" "$pkg" && continue ;;
      deb:) { ! have_cmd dpkg-query || have_deb "$pkg"; } && continue ;;
      clang-rt) have_deb "$pkg" && continue ;;
      py:headers) [[ -z $PY_VER || $PY_HEADERS == 1 ]] && continue ;;
      py:venv)
        [[ -z $PY_VER || $PY_NEEDS_VENV != 1 ]] && continue
        if "$PY" -c 'import ensurepip' >/dev/null 2>&1 &&
           ! { have_cmd dpkg-query && [[ $PY == /usr/* ]] && ! have_deb "$pkg"; }; then
          continue
        fi ;;
      py:pip)
        [[ -z $PY_VER || $PY_NEEDS_VENV == 1 ]] && continue
        "$PY" -m pip --version >/dev/null 2>&1 && continue ;;
      *) say "$PKG_LIST: unknown check '$check' for $pkg"; exit 2 ;;
    esac
    need "$pkg" "$req" "$what"
  done <"$PKG_LIST"
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
    # "ray[data]>=2.60": the extras in brackets are not checked, the version is
    name, op, want = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(==|>=)?\s*(\S*)",
                              req).groups()
    want = want.split(",")[0]  # ">=13,<14": the lower bound is what is checked
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

# The requirements of pyproject.toml's extras NAME...: the one list of
# Python packages (a small reader: tomllib is 3.11+ and these are flat lists).
extra_reqs() {
  "$PY" - "$ROOT/pyproject.toml" "$@" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
sec = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
def reqs(name, seen):
    # "npyload[ray]" inside an extra names another extra of this project
    m = sec and re.search(r"^%s\s*=\s*\[(.*?)\]$" % re.escape(name), sec.group(1), re.S | re.M)
    if not m:
        sys.exit("pyproject.toml has no extra '%s'" % name)
    out = []
    for r in re.findall(r'"([^"]+)"', m.group(1)):
        own = re.match(r"npyload\[([^\]]+)\]$", r)
        if own:
            for x in own.group(1).split(","):
                if x.strip() not in seen:
                    seen.add(x.strip())
                    out += reqs(x.strip(), seen)
        else:
            out.append(r)
    return out
for name in sys.argv[2:]:
    print(" ".join(reqs(name, {name})))
EOF
}

PIP_REQS=()
if wants test; then
  python_facts || exit 1
  extras=(test)
  wants docs && extras+=(docs)
  wants ci && extras+=(ci)
  read -r -a PIP_REQS <<<"$(extra_reqs "${extras[@]}" | tr '\n' ' ')" || true
  ((${#PIP_REQS[@]})) || { say "ERROR: no Python requirements read from pyproject.toml"; exit 1; }
fi

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
