"""The documentation's generated parts cover what they are generated from,
checked without Sphinx (docs/_ext/npyload_docgen.py is plain Python), so
that the README's test command catches a drift before the docs build does:

* troubleshooting: every code of NPYLOAD_ERROR_MAP, every -errno the
  library's code returns by name, and every exception class the package
  raises has a section (cause and fix) in docs/troubleshooting.md;
* the C API reference declares every function of include/npyload.h (found
  here with a different pattern than the generator's) and every symbol the
  shared library exports (nm -D, the independent truth);
* the tools' page lists every program pyproject.toml installs, and no
  hand-written page keeps a copy of a program's usage text."""
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "docs" / "_ext"))
import npyload_docgen as docgen  # noqa: E402

TROUBLE = REPO / "docs" / "troubleshooting.md"


def test_every_error_has_a_troubleshooting_section():
    have = set(docgen.troubleshooting_sections(TROUBLE.read_text()))
    codes = [c for c, _, _ in docgen.error_codes()]
    assert len(codes) >= 15 and "NPYLOAD_ECHANGED" in codes
    assert "ENOMEM" in docgen.errno_codes() and "EMFILE" in docgen.errno_codes()
    missing = (set(codes) | set(docgen.errno_codes()) | set(docgen.python_error_classes())) - have
    assert not missing, f"docs/troubleshooting.md: add a '### NAME' section for {sorted(missing)}"
    docgen.errors_markdown()  # what the docs build runs: raises on the same


def test_a_new_code_without_a_section_fails(tmp_path):
    """The check can fail: a header with one more code is refused by name."""
    h = (REPO / "include" / "npyload.h").read_text()
    row = '    XX(REMOTE, -10015, "remote storage request failed")'
    assert row in h
    h2 = h.replace(row, row + '                  \\\n    XX(NEWTHING, -10099, "a new failure")')
    (tmp_path / "npyload.h").write_text(h2)
    with pytest.raises(ValueError, match="NPYLOAD_ENEWTHING"):
        docgen.errors_markdown(tmp_path / "npyload.h", TROUBLE)


def test_every_message_is_listed():
    c, py = docgen.c_messages(), docgen.py_messages()
    assert sum(map(len, c.values())) >= 200, {k: len(v) for k, v in c.items()}
    assert "NPYLOAD_EMISMATCH" in c and "ValueError" in py
    md = docgen.messages_markdown()
    assert "no files match" in md


def _header_functions():
    text = (REPO / "include" / "npyload.h").read_text()
    return set(re.findall(r"^NPYLOAD_API\b[^;(]*?\b(npyload_\w+)\s*\(", text, re.M))


def test_c_api_reference_declares_every_function():
    names = docgen.declared_names()
    funcs = _header_functions()
    assert len(funcs) >= 60
    missing = sorted(f for f in funcs if names.get(f) != "function")
    assert not missing, f"not in the C API reference: {missing}"
    md = docgen.c_api_markdown()
    for f in funcs:
        assert f"````{{c:function}} " in md and re.search(rf"\b{f}\(", md), f


def test_c_api_reference_declares_every_exported_symbol():
    build = Path(__import__("os").environ.get("NPYLOAD_BUILD_DIR", REPO / "build"))
    if not build.is_absolute():
        build = REPO / build
    libs = sorted((build / "lib").glob("libnpyload.so*")) or sorted(build.glob("**/libnpyload.so"))
    if not libs or shutil.which("nm") is None:
        pytest.skip(f"no libnpyload.so under {build} (or no nm): build it first")
    out = subprocess.run(["nm", "-D", "--defined-only", str(libs[0])], capture_output=True,
                         text=True, check=True).stdout
    exported = {ln.split()[-1] for ln in out.splitlines() if " T " in ln}
    exported = {s for s in exported if s.startswith("npyload_")}
    assert len(exported) >= 60, exported
    missing = sorted(exported - set(docgen.declared_names()))
    assert not missing, f"exported but not in the C API reference: {missing}"


def test_tools_page_covers_every_installed_program():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert sorted(scripts) == sorted(docgen.TOOLS)


def test_no_hand_kept_copy_of_a_usage_text():
    """The usage lines of --help live in the programs; pages include them
    from the programs at build time (docs/_generated/tools-help.md)."""
    pages = [REPO / "README.md", REPO / "bench" / "README.md", REPO / "ARCHITECTURE.md"]
    pages += [p for p in (REPO / "docs").glob("*.md")]
    for p in pages:
        for n, line in enumerate(p.read_text().splitlines(), 1):
            assert not re.match(r"\s*usage: (npyload-|python -m npyload)", line), \
                f"{p.relative_to(REPO)}:{n}: a copy of a program's usage: include it instead"
