"""Sphinx configuration of npyload's documentation (docs/).

Build: ``bash scripts/build-docs.sh`` (the README's one line), which runs
``sphinx-build -W --keep-going -n -b html docs build/docs/html`` against the
installed package: the Python API is read from its docstrings, the tools'
pages from their ``--help``, and the C API from include/npyload.h
(docs/_ext/npyload_docgen.py). Every warning, a broken link or a reference
that does not resolve among them, fails the build.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "_ext"))

import npyload  # noqa: E402  the installed package: autodoc reads it

project = "npyload"
author = "the npyload authors"
copyright = "the npyload authors"
release = version = npyload.__version__

extensions = [
    "myst_parser",             # the pages are Markdown, like the README they came from
    "sphinx.ext.autodoc",      # the Python API from the docstrings
    "sphinx.ext.napoleon",     # ... which use the numpydoc layout
    "npyload_sphinx",          # generated parts: C API, tools' --help, error table
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated", "README.md"]
root_doc = "index"

# Links: every heading up to level 4 is an anchor ([text](page.md#a-heading)).
myst_heading_anchors = 4
myst_enable_extensions = ["deflist"]

# A reference that resolves nowhere is a warning, and warnings fail the
# build. The site is built offline (no intersphinx), so names of other
# projects (int, numpy.ndarray, torch.Tensor, os.PathLike...) cannot
# resolve; npyload's own must.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:(class|obj|data|exc)", r"(?!npyload\b).*"),
    (r"c:identifier", r"(u?int(8|16|32|64)_t|size_t|ssize_t|uintptr_t|va_list)"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_numpy_docstring = True
napoleon_google_docstring = False

html_theme = "furo"
html_title = f"npyload {release}"
html_static_path = []
html_copy_source = False
html_show_sourcelink = False
