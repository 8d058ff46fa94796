"""Sphinx glue for npyload's docs: writes the generated parts
(npyload_docgen.write_generated) before Sphinx reads the sources, and
rewrites the links of the repository's own Markdown files (ARCHITECTURE.md,
bench/README.md, ...) that the docs include, so that one text serves both
the repository and the site."""
from __future__ import annotations

import re
from pathlib import Path

import npyload_docgen

DOCS = Path(__file__).resolve().parents[1]
REPO = DOCS.parent

# Repository files that are pages (or parts of pages) of the site.
INCLUDED = {
    "ARCHITECTURE.md": "architecture.md",
    "lib/loader/README.md": "architecture.md#libloader-how-it-is-put-together",
    "bench/README.md": "bench-notes.md",
    "tests/gpu/README.md": "development.md#gpu-verification",
    "README.md": "index.md",
}


def _generate(app):
    npyload_docgen.write_generated(DOCS / "_generated")


def _rewrite_links(app, relative_path, parent_docname, content):
    """An included repository file's links point at repository paths: a file
    the site shows becomes a link to its page, any other becomes its path in
    code (the site has no copy of it)."""
    src = Path(relative_path)
    if not src.is_absolute():
        src = Path(app.srcdir) / src
    base = src.resolve().parent.relative_to(REPO)

    def repl(m):
        text, target = m.group(1), m.group(2)
        if re.match(r"[a-z]+://|#", target):
            return m.group(0)
        path, _, frag = target.partition("#")
        repo_path = (Path(base) / path).as_posix()
        repo_path = re.sub(r"^(\./)+", "", str(Path(repo_path)))
        page = INCLUDED.get(repo_path)
        if page is None and repo_path.startswith("docs/") and repo_path.endswith(".md"):
            page = repo_path[len("docs/"):]
        if page:
            return f"[{text}](/{page}{'#' + frag if frag else ''})"
        return f"{text} (`{repo_path}`)" if text.strip("`") != repo_path else f"`{repo_path}`"

    content[0] = re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", repl, content[0])


def setup(app):
    app.connect("builder-inited", _generate)
    app.connect("include-read", _rewrite_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
