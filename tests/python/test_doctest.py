"""The docstring examples of the installed package run (doctest), and every
public name defined in Python has one, in the numpydoc layout the package
uses (a summary, "Parameters" where it takes any, an "Examples" section).

Runs on the installed package (``pip install .``), in a scratch directory:
the examples make their own files with numpy and tempfile, without torch
(``output="numpy"``)."""
import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import npyload

MODULES = sorted(m.name for m in pkgutil.iter_modules(npyload.__path__, "npyload.")
                 if m.name != "npyload.__main__")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# Public names written in Python (the rest are the C extension's functions
# and NpyloadError, documented in _npyload.pyi and include/npyload.h).
PY_PUBLIC = ["Loader", "Batch", "BatchTuple", "Transform", "TransformError",
             "build_info", "pack", "write"]


@pytest.mark.parametrize("name", ["npyload"] + MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    if name == "npyload.mypy_plugin" and importlib.util.find_spec("mypy") is None:
        pytest.skip("npyload.mypy_plugin imports mypy, which is not installed: "
                    "pip install 'mypy>=1.13' (the 'test' extra of pyproject.toml)")
    monkeypatch.chdir(tmp_path)
    mod = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in finder.find(mod, name):
        runner.run(test)
    res = runner.summarize(verbose=False)
    assert res.failed == 0, f"{name}: {res.failed} of {res.attempted} doctest examples failed (above)"


def test_every_public_python_name_has_a_running_example():
    missing, attempted = [], 0
    for name in PY_PUBLIC:
        obj = getattr(npyload, name)
        assert name in npyload.__all__, name
        doc = obj.__doc__ or ""
        if "\n    Examples\n    --------\n" not in doc or ">>> " not in doc:
            missing.append(name)
        tests = doctest.DocTestFinder(recurse=False).find(obj, name)
        attempted += sum(len(t.examples) for t in tests)
    assert not missing, f"no 'Examples' section with doctest examples in: {missing}"
    assert attempted >= 5 * len(PY_PUBLIC)
