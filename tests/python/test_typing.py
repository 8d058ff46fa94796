"""The package is typed (PEP 561): py.typed and the extension's stub are
installed, ``mypy --strict`` accepts a user's use of the whole public API
(tests/python/typed_api_use.py, which pins the types down with assert_type),
the examples and the package's own code, and refuses wrong calls (WRONG_USE),
the stub lists what the extension has (mypy's stubtest),
and the stub's dicts have the keys and value types the functions return.

mypy is in the "test" extra of pyproject.toml; without it the mypy checks
skip, naming what to install. The two mypy --strict runs also need torch
(mypy reads torch's types), which only the "ci" profile installs: without
it they skip, naming it."""
import ast
import importlib.util
import inspect
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import npyload

REPO = pathlib.Path(__file__).resolve().parents[2]
PKG = pathlib.Path(npyload.__file__).parent
USE = REPO / "tests" / "python" / "typed_api_use.py"
EXAMPLES = sorted((REPO / "examples").glob("*.py"))


def _need_mypy():
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed: pip install 'mypy>=1.13' (it is in the "
                    "'test' extra of pyproject.toml)")


def _need_torch_for_mypy():
    """mypy --strict follows the package's torch paths (npyload._torch) and
    the examples into torch's own types: without torch it reports "Cannot
    find implementation or library stub for module named 'torch'"."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("mypy checks the torch paths against torch's types, and torch is not "
                    "installed: pip install torch==2.13.0 (the 'ci' extra of pyproject.toml; "
                    "CI runs these with it)")


def _run(args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_marker_and_stub_are_installed():
    assert (PKG / "py.typed").is_file(), f"{PKG}/py.typed is not installed"
    assert (PKG / "_npyload.pyi").is_file(), f"{PKG}/_npyload.pyi is not installed"


# Calls a type checker must refuse (line: what the error must show): a
# wrongly typed argument (mypy names the argument types in call order, see
# test_mypy_strict_refuses_wrong_calls) and a DataLoader keyword npyload does
# not have. An Any-typed fallback overload or a **kwargs in an overload would
# let them through.
WRONG_USE = """import npyload

npyload.Loader({"x": "x_*.npy"}, batch_size="64")
npyload.Loader({"x": "x_*.npy"}, 64, prefetch_factor=2)
"""
WRONG_LINES = {3: '"str"', 4: '"prefetch_factor"'}


@pytest.fixture(scope="module")
def user_mypy(tmp_path_factory):
    """One mypy --strict run over typed_api_use.py, the examples and
    WRONG_USE: (path of the WRONG_USE file, the completed process)."""
    _need_mypy()
    _need_torch_for_mypy()
    assert EXAMPLES, "no examples/*.py"
    d = tmp_path_factory.mktemp("mypy_user")
    wrong = d / "wrong_use.py"
    wrong.write_text(WRONG_USE)
    # Run outside the checkout (absolute paths) with a fresh cache, so that
    # the installed package is what is checked and nothing is left behind.
    out = _run(["mypy", "--strict", "--cache-dir", str(d / "cache"), "--no-color-output",
                str(USE), *map(str, EXAMPLES), str(wrong)], cwd=d)
    return wrong, out


def _checked(out):
    """mypy's summary says it checked typed_api_use, the examples and WRONG_USE."""
    n = 2 + len(EXAMPLES)
    return f"checked {n} source files" in out.stdout or f"in {n} source files" in out.stdout


def _errors(out):
    return [ln for ln in out.stdout.splitlines() if ": error:" in ln]


def test_mypy_strict_accepts_the_user_code(user_mypy):
    """Fails when py.typed or the stub is missing (mypy: "missing library
    stubs or py.typed marker", and every assert_type sees Any), when an
    annotation is wrong for what a user does, or when it loses a type."""
    wrong, out = user_mypy
    others = [ln for ln in _errors(out) if not ln.startswith(f"{wrong.name}:")]
    assert out.returncode in (0, 1) and others == [] and _checked(out), \
        f"mypy --strict failed:\n{out.stdout}{out.stderr}"


def test_mypy_strict_refuses_wrong_calls(user_mypy):
    """Each call of WRONG_USE is an error on its line, and its other lines
    are not: the overloads accept no Any and no unknown keyword."""
    wrong, out = user_mypy
    assert out.returncode == 1, out.stdout + out.stderr
    by_line: dict[int, list[str]] = {}
    for ln in _errors(out):
        if ln.startswith(f"{wrong.name}:"):  # mypy prints it relative to its cwd
            by_line.setdefault(int(ln[len(f"{wrong.name}:"):].split(":")[0]), []).append(ln)
    assert set(by_line) == set(WRONG_LINES) and _checked(out), out.stdout
    for line, shows in WRONG_LINES.items():
        assert any(shows in ln for ln in by_line[line]), (line, shows, out.stdout)


def test_mypy_strict_accepts_the_package_bodies(tmp_path):
    """The installed package's own code passes mypy --strict: every function
    annotated, no Any leaking into a typed return, TypedDicts built as
    declared. Fails on an unannotated def added to any module."""
    _need_mypy()
    _need_torch_for_mypy()
    out = _run(["mypy", "--strict", "--cache-dir", str(tmp_path / "cache"),
                "--no-color-output", "-p", "npyload"], cwd=tmp_path)
    assert out.returncode == 0, f"mypy --strict -p npyload:\n{out.stdout}{out.stderr}"
    assert "no issues found" in out.stdout, out.stdout


def test_stubtest_extension(tmp_path):
    """Every public name of npyload._npyload is in _npyload.pyi and nothing
    in the stub is missing at run time (the C functions carry no text
    signature, so their parameters are not compared: the dict tests below
    and the user code above cover what they return)."""
    _need_mypy()
    # (without the stub, stubtest finds nothing to compare and succeeds)
    assert (PKG / "_npyload.pyi").is_file(), f"{PKG}/_npyload.pyi is not installed"
    out = _run(["mypy.stubtest", "npyload._npyload"], cwd=tmp_path)
    assert out.returncode == 0, f"stubtest:\n{out.stdout}{out.stderr}"


def test_typed_api_use_runs(tmp_path):
    """The typed uses also work as written (numpy only, no mypy needed)."""
    out = subprocess.run([sys.executable, str(USE), str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "typed_api_use: ok" in out.stdout


def _names(node):
    """Attribute names used on `npyload` and keywords of `npyload.F(...)` calls."""
    attrs, calls = set(), {}
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and \
                n.value.id == "npyload":
            attrs.add(n.attr)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                isinstance(n.func.value, ast.Name) and n.func.value.id == "npyload":
            calls.setdefault(n.func.attr, []).append(n)
    return attrs, calls


def test_typed_api_use_covers_the_public_api():
    """Every public name, and every argument of the functions with many, is
    used (so checked by mypy) in typed_api_use.py."""
    attrs, calls = _names(ast.parse(USE.read_text()))
    assert set(npyload.__all__) - attrs == set(), "not used in typed_api_use.py"
    for name in ("Loader", "Transform", "pack", "write"):
        params = [p for p, v in inspect.signature(getattr(npyload, name)).parameters.items()
                  if v.kind is not inspect.Parameter.VAR_KEYWORD]  # DataLoader's names
        used = set()
        for call in calls.get(name, []):
            used |= {k.arg for k in call.keywords}
            used |= set(params[:len(call.args)])
        assert set(params) - used == set(), f"npyload.{name}: arguments not used"


def test_loader_overloads_match_the_implementation():
    """Loader.__init__'s overloads (the batch type follows as_tuple and
    transform) take the implementation's parameters, in its order, with its
    defaults (`...` where an overload needs a value given)."""
    tree = ast.parse((PKG / "_loader.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Loader")
    inits = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
    *overloads, impl = inits
    assert len(overloads) >= 4 and all(
        any(ast.unparse(d) == "overload" for d in f.decorator_list) for f in overloads)

    def params(f):
        a = f.args
        pos = a.posonlyargs + a.args
        defaults = [None] * (len(pos) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
        kw = [(k.arg, None if d is None else ast.unparse(d))
              for k, d in zip(a.kwonlyargs, a.kw_defaults)]
        return [(p.arg, d) for p, d in zip(pos, defaults)][1:] + kw

    want = params(impl)
    for f in overloads:
        got = params(f)
        assert [n for n, _ in got] == [n for n, _ in want], f"overload at line {f.lineno}"
        for (n, d), (_, w) in zip(got, want):
            assert d in (w, "..."), f"overload at line {f.lineno}: {n} = {d}, not {w}"


def _typed_dicts():
    """{TypedDict name: {key: (annotation, required)}} from the installed stub."""
    tree = ast.parse((PKG / "_npyload.pyi").read_text())
    out = {}
    for n in tree.body:
        if isinstance(n, ast.ClassDef) and any(ast.unparse(b) == "TypedDict" for b in n.bases):
            keys = {}
            for a in n.body:
                if isinstance(a, ast.AnnAssign):
                    ann = ast.unparse(a.annotation)
                    req = not ann.startswith("NotRequired[")
                    keys[a.target.id] = (ann[len("NotRequired["):-1] if not req else ann, req)
            out[n.name] = keys
    return out


def _check_dict(d, spec, allow=()):
    want = {k for k, (_, req) in spec.items() if req or k in allow}
    assert set(d) == want, (sorted(set(d) - want), sorted(want - set(d)))
    exact = {"int": int, "str": str, "bool": bool, "float": float}
    for k, v in d.items():
        ann = spec[k][0]
        if ann in exact:
            assert type(v) is exact[ann], (k, ann, v)
        elif ann == "str | None":
            assert v is None or type(v) is str, (k, ann, v)
        elif ann == "dict[str, int]":
            assert type(v) is dict and all(type(a) is str and type(b) is int
                                           for a, b in v.items()), (k, v)
        elif ann == "int | list[int]":
            assert type(v) is int or (type(v) is list and all(type(x) is int for x in v)), (k, v)
        elif ann == "tuple[int, ...]" or ann == "tuple[int, int]":
            assert type(v) is tuple and all(type(x) is int for x in v), (k, v)
            assert ann.endswith("...]") or len(v) == 2, (k, v)
        else:
            raise AssertionError(f"test_typing: no check for {ann!r} ({k})")


def test_stub_dicts_match_what_the_functions_return(tmp_path):
    spec = _typed_dicts()
    assert set(spec) == {"LoaderState", "LoaderStats", "HeaderInfo", "PackResult",
                         "BuildInfo", "PrefetchProgress"}, set(spec)
    if npyload.build_info()["remote_compiled"]:
        pf = npyload._npyload.Prefetch({"cache_dir": str(tmp_path / "pcache")})
        _check_dict(pf.progress(), spec["PrefetchProgress"])
    py = ("python", "numpy", "torch")
    _check_dict(npyload.build_info(), spec["BuildInfo"], allow=py)
    _check_dict(npyload._npyload.build_info(), spec["BuildInfo"])  # without them
    x = np.arange(48, dtype=np.float32).reshape(12, 4)
    codes = np.tile(np.array([0.5, 1.5, -2.0], dtype=np.float32), 8).reshape(6, 4)
    np.save(tmp_path / "x_0000.npy", x)
    np.save(tmp_path / "n_0000.npy", codes)
    with npyload.Loader({"x": str(tmp_path / "x_*.npy")}, 4, num_workers=1,
                        output="numpy") as ld:
        next(iter(ld))
        _check_dict(ld.state_dict(), spec["LoaderState"], allow=("loop_ended",))
        _check_dict(ld._live().get_state(), spec["LoaderState"])  # the extension's
        loop = ("hook_ns", "transform_workers", "loop_wait_ns", "loop_step_ns")
        mix = ("source_samples", "digest", "digest_rows")  # Python's, with or without sources
        _check_dict(ld.stats(), spec["LoaderStats"], allow=loop + mix)
        _check_dict(ld._c.stats(), spec["LoaderStats"])  # the extension's: without them
    two = {"a": {"x": str(tmp_path / "x_*.npy")}, "b": {"x": str(tmp_path / "x_*.npy")}}
    with npyload.Loader(sources=two, batch_size=4, num_workers=1, output="numpy") as ld:
        next(iter(ld))
        rec = ("loop_ended", "mix_samples", "mix_weights", "mix_draws", "mix_block",
               "mix_epoch", "mix_position")
        _check_dict(ld.state_dict(), spec["LoaderState"], allow=rec)

    h = spec["HeaderInfo"]
    zst = ("compressed_bytes", "ratio", "frames", "samples_per_frame")
    _check_dict(npyload.inspect(tmp_path / "x_0000.npy"), h)
    (r,) = npyload.pack(tmp_path / "x_0000.npy")
    _check_dict(r, spec["PackResult"])
    _check_dict(npyload.inspect(r["out"]), h, allow=zst)
    _check_dict(npyload.inspect(r["out"], verify=True), h, allow=zst + ("verified", "checksums"))
    (r,) = npyload.pack(tmp_path / "n_0000.npy", narrow=True)
    assert r["narrow_values"] == 3
    _check_dict(npyload.inspect(r["out"]), h, allow=zst + ("narrow_values", "value_descr"))
    assert set(h) == {k for k, (_, req) in h.items() if req} | set(zst) | {
        "verified", "checksums", "narrow_values", "value_descr"}
