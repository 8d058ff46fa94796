#!/usr/bin/env bash
# Builds the documentation site of docs/ into build/docs/html (Sphinx, the
# "docs" extra of pyproject.toml), warnings as errors: a broken link, a
# reference that resolves nowhere, a C declaration the C domain cannot parse,
# an error code without its troubleshooting entry all fail the build.
#
#   bash scripts/build-docs.sh              # set-up, pip install ., build
#   bash scripts/build-docs.sh --check      # and look at it in headless Chromium
#                                           #   (tests/docs: screenshots, search)
#   bash scripts/build-docs.sh --no-install # the installed npyload is this
#                                           #   checkout's already (CI)
#
# The Python API is read from the installed package's docstrings and the
# tools' pages from the installed programs' --help, so the package is
# installed first (scripts/setup-deps.sh docs: the test profile, the docs
# extra, and Debian's chromium for --check).
set -euo pipefail
cd "$(dirname "$0")/.."
check=0 install=1
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    --no-install) install=0 ;;
    *) echo "usage: $0 [--check] [--no-install]" >&2; exit 2 ;;
  esac
done
bash scripts/setup-deps.sh docs
source scripts/setup-deps.sh docs
PY=${NPYLOAD_PYTHON:-python3}
OUT=build/docs
if [[ $install == 1 ]]; then
  ISO=()
  "$PY" -c "import scikit_build_core" 2>/dev/null && ISO=(--no-build-isolation)
  # A build directory of its own keeps later builds incremental.
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q "${ISO[@]}" \
    --config-settings=build-dir="$OUT/pip-build" .
fi
rm -rf "$OUT/html" "$OUT/doctrees"
"$PY" -m sphinx -W --keep-going -n -q -b html -d "$OUT/doctrees" docs "$OUT/html"
echo "docs: $OUT/html/index.html"
if [[ $check == 1 ]]; then
  NPYLOAD_DOCS_HTML="$OUT/html" NPYLOAD_DOCS_CHECK=1 "$PY" -m pytest -q tests/docs
fi
