"""The generated parts of npyload's documentation, each from its one source.

Plain Python (no Sphinx import), so that the tests check the same functions
the docs build runs (tests/python/test_docs_sources.py):

* c_api_markdown(header): the C API reference, from include/npyload.h. The
  header's comments are zstd-style ``/*! ... */`` blocks of plain text, and
  zstd generates its own manual from zstd.h's comments with a small program
  of the same kind (contrib/gen_html): each paragraph of the header (lines
  up to a blank line) becomes its declarations as Sphinx C-domain objects
  (so they are indexed, searchable and cross-referenced:
  {c:func}`npyload_loader_next`), its ``/*!`` text as the header shows it,
  and its code as a C block.
* error_codes(header) and errors_markdown(...): the troubleshooting table,
  from NPYLOAD_ERROR_MAP (the table that also generates npyload_strerror) and
  the -errno values the library's code returns, checked against the
  sections of docs/troubleshooting.md.
* tools_markdown(): each tool's ``--help`` and ``python -m npyload``'s usage,
  run at build time from the installed package.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "include" / "npyload.h"

# ---------------------------------------------------------------- C API ----


@dataclass
class Decl:
    kind: str          # function, macro, struct, enum, type, enumerator
    name: str
    signature: str     # what the C-domain directive takes
    members: list = field(default_factory=list)   # enumerators of an enum


@dataclass
class Para:
    heading: tuple[int, str] | None = None   # (level, title) of a banner
    doc: list[str] = field(default_factory=list)     # /*! text, lines
    code: list[str] = field(default_factory=list)    # everything else, verbatim
    decls: list[Decl] = field(default_factory=list)


def _paragraphs(text: str) -> list[list[str]]:
    """Lines grouped up to blank lines, never splitting a comment or a
    brace/parenthesis group."""
    paras, cur, depth, in_comment = [], [], 0, False
    for line in text.splitlines():
        if not line.strip() and depth == 0 and not in_comment:
            if cur:
                paras.append(cur)
            cur = []
            continue
        cur.append(line)
        i = 0
        while i < len(line):
            if in_comment:
                j = line.find("*/", i)
                if j < 0:
                    break
                in_comment, i = False, j + 2
            elif line.startswith("/*", i):
                in_comment, i = True, i + 2
            elif line.startswith("//", i):
                break
            elif line[i] == '"':
                j = i + 1
                while j < len(line) and line[j] != '"':
                    j += 2 if line[j] == "\\" else 1
                i = j + 1
            else:
                depth += {"{": 1, "(": 1, "}": -1, ")": -1}.get(line[i], 0)
                i += 1
    if cur:
        paras.append(cur)
    return paras


_BANNER = re.compile(r"/\* -{20,} \*/")
_TITLE = re.compile(r"/\*\s*(\S.*?)\s*\*/")
_SUBBANNER = re.compile(r"/\* -{3,} (.+?) -{3,} \*/")
_SKIP_MACROS = {"NPYLOAD_H", "NPYLOAD_API"}


def _strip_comments(code: str) -> str:
    return re.sub(r"/\*.*?\*/", " ", code, flags=re.S)


def _doc_lines(comment: str) -> list[str]:
    """The text of a /*! ... */ comment, markers and the ' * ' gutter removed."""
    body = comment[3:-2]
    lines = body.splitlines()
    out = []
    for i, ln in enumerate(lines):
        if i == 0:
            out.append(ln.strip())
            continue
        m = re.match(r"\s*\*( ?)(.*)$", ln)
        out.append(m.group(2).rstrip() if m else ln.strip())
    while out and not out[-1]:
        out.pop()
    return out


def _xx_entries(header: str, table: str) -> list[tuple[str, str]]:
    """The XX(NAME, value, ...) rows of an X-macro table: [(NAME, value)]."""
    m = re.search(r"#define %s\(XX\)(.*?)(?<!\\)\n" % table, header, re.S)
    if not m:
        raise ValueError(f"{HEADER.name}: no #define {table}(XX)")
    return re.findall(r"XX\(\s*(\w+)\s*,\s*(-?\w+)", m.group(1))


def _decls(code: str, header: str) -> list[Decl]:
    src = _strip_comments(code)
    out: list[Decl] = []
    for m in re.finditer(r"^\s*#\s*define\s+(\w+)(\([^)]*\))?", src, re.M):
        name = m.group(1)
        if name.startswith("NPYLOAD") and name not in _SKIP_MACROS and \
                not name.startswith("NPYLOAD_XX_"):
            out.append(Decl("macro", name, name + (m.group(2) or "")))
    # Declarations proper: the text outside preprocessor lines, split at ';'
    # at depth 0.
    body = "\n".join(ln for ln in _join_continuations(src).splitlines()
                     if not ln.lstrip().startswith("#"))
    for stmt in _statements(body):
        s = " ".join(stmt.split())
        if not s or s.startswith(("extern \"C\"", "}")):
            continue
        m = re.fullmatch(r"typedef (struct|enum) (\w+) \{(.*)\} (\w+)", s)
        if m:
            kind, tag, inner, name = m.groups()
            d = Decl(kind, name, name)
            if kind == "enum":
                d.members = _enumerators(inner, header)
            out.append(d)
            continue
        m = re.fullmatch(r"typedef struct (\w+) (\w+)", s)
        if m:
            out.append(Decl("type", m.group(2), f"struct {m.group(1)} {m.group(2)}"))
            continue
        m = re.fullmatch(r"typedef (.+)", s)
        if m:
            name = re.findall(r"\w+", re.sub(r"\(.*", "", s.replace("(*", " ")))[-1]
            out.append(Decl("type", name, m.group(1)))
            continue
        m = re.fullmatch(r"NPYLOAD_API (.+?\b(\w+)\s*\(.*\))", s)
        if m:
            sig = re.sub(r"\s*\)\s*$", ")", m.group(1))
            out.append(Decl("function", m.group(2), sig))
            continue
        raise ValueError(f"{HEADER.name}: a declaration the API reference cannot "
                         f"classify (add it to npyload_docgen._decls): {s!r}")
    return out


def _join_continuations(src: str) -> str:
    return re.sub(r"\\\n", " ", src)


def _statements(body: str) -> list[str]:
    out, cur, depth = [], [], 0
    for ch in body:
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        if ch == ";" and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    rest = "".join(cur).strip()
    if rest:
        out.append(rest)
    return out


def _enumerators(inner: str, header: str) -> list[str]:
    names = re.findall(r"\b(NPYLOAD_\w+)\s*(?:=|,|$)", inner)
    names = [n for n in names if not n.endswith("_MAP")]
    # An enum generated from an X-macro table: NPYLOAD_ERROR_MAP(NPYLOAD_XX_ENUM)
    m = re.search(r"(NPYLOAD_\w+_MAP)\(\s*(\w+)\s*\)", inner)
    if m:
        pat = re.search(r"#define %s\(name[^)]*\)\s*(\w*)##name" % m.group(2), header)
        prefix = pat.group(1) if pat else ""
        names += [prefix + n for n, _ in _xx_entries(header, m.group(1))]
    return names


def parse_header(path: Path = HEADER) -> tuple[list[str], list[Para]]:
    """(the file comment's lines, the paragraphs of the header)."""
    text = path.read_text()
    header = text
    m = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    intro = [re.sub(r"^\s*\* ?", "", ln).rstrip() for ln in m.group(1).splitlines()][1:]
    text = text[m.end():]
    # extern "C" { ... } wraps everything for C++: no part of the API.
    text = re.sub(r'#ifdef __cplusplus\s*\n(extern "C" \{|\})\s*\n#endif', "", text)
    paras: list[Para] = []
    for lines in _paragraphs(text):
        joined = "\n".join(lines)
        if _BANNER.fullmatch(lines[0].strip()) and len(lines) == 3:
            paras.append(Para(heading=(2, _TITLE.fullmatch(lines[1].strip()).group(1))))
            continue
        p = Para()
        sub = _SUBBANNER.fullmatch(lines[0].strip())
        if sub:
            paras.append(Para(heading=(3, sub.group(1))))
            lines = lines[1:]
            joined = "\n".join(lines)
            if not lines:
                continue
        # /*! comments are the documentation; the rest is code, verbatim.
        rest = joined
        for cm in re.finditer(r"/\*!.*?\*/", joined, re.S):
            if p.doc:
                p.doc.append("")
            p.doc += _doc_lines(cm.group(0))
        rest = re.sub(r"[ \t]*/\*!.*?\*/[ \t]*\n?", "", joined, flags=re.S)
        code = [ln for ln in rest.splitlines()]
        if all(re.fullmatch(r"\s*(#\s*(ifn?def|endif|if|else|include).*|}|extern \"C\" \{)?\s*",
                            ln) for ln in code):
            code = []            # include guards, extern "C", #include lines
        p.code = code
        p.decls = _decls("\n".join(code), header)
        # Code with neither documentation nor a public declaration (the
        # include guard, the NPYLOAD_API attribute) is not part of the API.
        if p.doc or p.decls:
            paras.append(p)
    return intro, paras


def declared_names(path: Path = HEADER) -> dict[str, str]:
    """{name: kind} of everything the API reference declares."""
    out = {}
    for p in parse_header(path)[1]:
        for d in p.decls:
            out[d.name] = d.kind
            for e in d.members:
                out[e] = "enumerator"
    return out


_DIRECTIVE = {"function": "c:function", "macro": "c:macro", "struct": "c:struct",
              "enum": "c:enum", "type": "c:type"}


def c_api_markdown(path: Path = HEADER) -> str:
    intro, paras = parse_header(path)
    md = ["<!-- generated from include/npyload.h by docs/_ext/npyload_docgen.py:"
          " edit the header, not this file -->", "",
          "## Conventions", "", "```none", *intro, "```", ""]
    for p in paras:
        if p.heading:
            level, title = p.heading
            md += ["#" * level + " " + title, ""]
            continue
        for i, d in enumerate(p.decls):
            last = i == len(p.decls) - 1
            md.append(f"````{{{_DIRECTIVE[d.kind]}}} {d.signature}")
            for e in d.members:
                md += [f"```{{c:enumerator}} {e}", "```"]
            if last:
                md += _body(p)
            md += ["````", ""]
        if not p.decls:
            md += _body(p) + [""]
    return "\n".join(md) + "\n"


def _body(p: Para) -> list[str]:
    out = []
    if p.doc:
        out += ["```none", *p.doc, "```"]
    if p.code:
        code = p.code
        while code and not code[0].strip():
            code = code[1:]
        out += ["```c", *code, "```"]
    return out


# ---------------------------------------------------------------- errors ---

def error_codes(path: Path = HEADER) -> list[tuple[str, int, str]]:
    """[(NPYLOAD_ENAME, value, npyload_strerror text)] from NPYLOAD_ERROR_MAP."""
    text = path.read_text()
    m = re.search(r"#define NPYLOAD_ERROR_MAP\(XX\)(.*?)(?<!\\)\n\n", text, re.S)
    rows = re.findall(r'XX\(\s*(\w+)\s*,\s*(-?\d+)\s*,\s*"([^"]*)"\)', m.group(1))
    if not rows:
        raise ValueError("NPYLOAD_ERROR_MAP: no rows found")
    return [("NPYLOAD_E" + n, int(v), s) for n, v, s in rows]


def errno_codes(root: Path = REPO) -> list[str]:
    """The -errno values the library's own code returns by name (``return
    -ENOENT``, ``rc = -EIO``, ``npyl_fail(err, len, -EEXIST, ...)``), sorted;
    comparisons (``rc == -EAGAIN``: retried inside) are not results."""
    pat = re.compile(r"(?:\breturn\s+|(?<![=!<>])=\s*|fail\w*\([^;]*?,\s*)-(E[A-Z0-9]{2,})\b",
                     re.S)
    names = set()
    for f in sorted((root / "lib").rglob("*.c")):
        names |= set(pat.findall(f.read_text()))
    return sorted(names)


def troubleshooting_sections(md: str) -> list[str]:
    """The ``### NAME`` section titles of docs/troubleshooting.md (the word
    before any space)."""
    return [m.group(1) for m in re.finditer(r"^### `?([\w.]+)`?", md, re.M)]


def errors_markdown(path: Path = HEADER, troubleshooting: Path | None = None) -> str:
    """The summary table of every error code, linking to its section; raises
    ValueError when a code has no section in troubleshooting.md or a section
    names a code that no longer exists."""
    codes = error_codes(path)
    errnos = errno_codes()
    t = troubleshooting or (REPO / "docs" / "troubleshooting.md")
    have = set(troubleshooting_sections(t.read_text()))
    want = {c for c, _, _ in codes} | set(errnos) | set(python_error_classes())
    missing = sorted(want - have)
    if missing:
        raise ValueError(f"{t}: no '### NAME' section (cause and fix) for: {', '.join(missing)}")
    stale = sorted(n for n in have if re.fullmatch(r"NPYLOAD_E\w+|E[A-Z0-9]+", n) and n not in want)
    if stale:
        raise ValueError(f"{t}: sections for codes the library no longer has: {', '.join(stale)}")
    md = ["| code | value | `npyload_strerror()` says |", "|---|---|---|"]
    for name, value, msg in codes:
        md.append(f"| [`{name}`](#{name.lower().replace('_', '-')}) | {value} | {msg} |")
    md += ["", "The operating system's codes the library returns as `-errno` "
           "(`npyload_strerror()` gives the C library's text for them): " +
           ", ".join(f"[`{e}`](#{e.lower()})" for e in errnos) + "."]
    return "\n".join(md) + "\n"


# -------------------------------------------------------------- messages ---

_PRI = {"PRIu64": "llu", "PRId64": "lld", "PRIi64": "lli", "PRIx64": "llx",
        "PRIu32": "u", "PRId32": "d", "PRIx32": "x", "PRIuMAX": "ju", "PRIdMAX": "jd"}
# Exceptions the package raises that are not failures a user meets as such:
# AttributeError answers numpy's probe for __array_struct__; argparse turns
# ArgumentTypeError into npyload-write's usage message.
NOT_USER_ERRORS = {"AttributeError", "argparse.ArgumentTypeError", "StopIteration"}


def _call_args(text: str, start: int) -> tuple[list[str], int]:
    """The top-level arguments of the call whose '(' is at text[start]."""
    args, cur, depth, i = [], [], 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i:j + 1])
            i = j + 1
            continue
        if c == "/" and text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        if c in "([{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args, i + 1
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    return args, i


def _literal(arg: str) -> str | None:
    """The text of a concatenation of C string literals (with PRI macros)."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"|(\bPRI\w+)', arg)
    rest = re.sub(r'"((?:[^"\\]|\\.)*)"|\bPRI\w+|\s+', "", arg)
    if not parts or rest:
        return None
    s = "".join(lit if lit or not mac else _PRI.get(mac, "d") for lit, mac in parts)
    return bytes(s, "utf-8").decode("unicode_escape")


def c_messages(root: Path = REPO) -> dict[str, list[str]]:
    """{code: [message formats]} of the library's failure calls
    (npyl_fail, npyl_loader_fail and the other *fail* helpers): the code
    when it is written in the call, "passed on" when it is a variable (the
    message then wraps an inner one)."""
    out: dict[str, set] = {}
    for f in sorted((root / "lib").rglob("*.c")):
        text = f.read_text()
        for m in re.finditer(r"\b\w*fail\w*\s*(?=\()", text):
            args, _ = _call_args(text, m.end())
            code = next((a for a in args if re.fullmatch(r"-?E[A-Z0-9]+|NPYLOAD_E[A-Z]+", a)),
                        None)
            msg = None
            for a in args:
                msg = _literal(a)
                if msg:
                    break
            if not msg or "%" == msg.strip():
                continue
            key = code.lstrip("-") if code else "passed on"
            out.setdefault(key, set()).add(msg)
    return {k: sorted(v) for k, v in sorted(out.items())}


def py_messages(root: Path = REPO) -> dict[str, list[str]]:
    """{exception class: [messages]} of the Python package's raises and the
    extension's PyErr_Format / PyErr_SetString calls."""
    import ast
    out: dict[str, set] = {}
    for f in sorted((root / "python_bindings" / "npyload").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = ast.unparse(node.exc.func)
                if not node.exc.args:
                    continue
                a = node.exc.args[0]
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    msg = a.value
                elif isinstance(a, ast.JoinedStr):
                    msg = "".join(v.value if isinstance(v, ast.Constant)
                                  else "{" + ast.unparse(v.value) + "}" for v in a.values)
                else:
                    msg = "(built by " + ast.unparse(a)[:60] + ")"
                out.setdefault(name, set()).add(msg)
    for f in sorted((root / "python_bindings" / "src").glob("*.c")):
        text = f.read_text()
        for m in re.finditer(r"\bPyErr_(?:Format|SetString)\s*(?=\()", text):
            args, _ = _call_args(text, m.end())
            if len(args) >= 2 and args[0].startswith("PyExc_"):
                msg = _literal(args[1])
                if msg:
                    out.setdefault(args[0][len("PyExc_"):], set()).add(msg)
    return {k: sorted(v) for k, v in sorted(out.items())}


def _md_code(s: str) -> str:
    s = " ".join(s.split())
    ticks = "``" if "`" in s else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{s}{pad}{ticks}"


def messages_markdown() -> str:
    md = ["<!-- generated from lib/ and python_bindings/ by docs/_ext/npyload_docgen.py -->", ""]
    for code, msgs in c_messages().items():
        anchor = "" if code == "passed on" else f" ([cause and fix](#{code.lower().replace('_', '-')}))"
        title = ("wrapping another failure (its code)" if code == "passed on" else f"`{code}`")
        md += [f"**C library, {title}**{anchor}", ""]
        md += [f"- {_md_code(m)}" for m in msgs] + [""]
    for cls, msgs in py_messages().items():
        if cls in NOT_USER_ERRORS:
            continue
        md += [f"**Python, `{cls}`** ([cause and fix](#{cls.lower()}))", ""]
        md += [f"- {_md_code(m)}" for m in msgs] + [""]
    return "\n".join(md)


def python_error_classes(root: Path = REPO) -> list[str]:
    """The exception classes a user can meet from the package (each needs a
    section in troubleshooting.md), plus the two of its own."""
    names = set(py_messages(root)) - NOT_USER_ERRORS
    return sorted(names | {"NpyloadError", "TransformError", "RuntimeWarning"})


# ----------------------------------------------------------------- tools ---

TOOLS = ["npyload-inspect", "npyload-gen", "npyload-pack", "npyload-bench", "npyload-write",
         "npyload-prefetch", "npyload-model"]


def _tool_path(name: str) -> list[str]:
    exe = shutil.which(name, path=os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
    if exe is None:
        raise FileNotFoundError(f"{name} not found: the docs build needs the installed "
                                f"package (pip install '.[docs]')")
    return [exe]


def run_help(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {out.returncode}\n{out.stderr}")
    return out.stdout.rstrip() + "\n"


def tools_markdown() -> str:
    md = ["<!-- generated at build time from each program's --help "
          "(docs/_ext/npyload_docgen.py) -->", ""]
    for name in TOOLS:
        md += [f"### {name}", "", "```none",
               run_help(_tool_path(name) + ["--help"]).rstrip(), "```", ""]
    md += ["### python -m npyload", "", "```none",
           run_help([sys.executable, "-m", "npyload", "--help"]).rstrip(), "```", ""]
    return "\n".join(md)


def info_markdown() -> str:
    return "\n".join(["```none", run_help([sys.executable, "-m", "npyload", "info"]).rstrip(),
                      "```", ""])


def write_generated(outdir: Path) -> list[Path]:
    """Writes every generated page part into outdir (docs/_generated)."""
    outdir.mkdir(parents=True, exist_ok=True)
    parts = {"c-api.md": c_api_markdown(), "errors.md": errors_markdown(),
             "messages.md": messages_markdown(),
             "tools-help.md": tools_markdown(), "info.md": info_markdown()}
    paths = []
    for name, text in parts.items():
        p = outdir / name
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
        paths.append(p)
    return paths
