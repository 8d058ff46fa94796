"""The package is typed (PEP 561): py.typed and the extension's stub are
installed, ``mypy --strict`` accepts a user's use of the whole public API
(tests/python/typed_api_use.py, which pins the types down with assert_type),
the examples and the package's own code, and refuses wrong calls (WRONG_USE),
the stub lists what the extension has (mypy's stubtest),
and the stub's dicts have the keys and value types the functions return.

mypy is in the "test" extra of pyproject.toml; without it the mypy checks
skip, naming what to install. The two mypy --strict runs also need torch
(mypy reads torch's types), which only the "ci" profile installs: without
it they skip, naming it.

With npyload's mypy plugin (``plugins = npyload.mypy_plugin``) the same
runs give the same types and a message that names the wrong argument
(test_mypy_plugin_*), and a plugin whose mypy internals are missing leaves
mypy's ordinary messages, without a crash."""
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
# not have; a str for num_workers= or prefetch= (int | Literal["auto"]); a
# transform= for the other batch type. An Any-typed fallback overload or a
# **kwargs in an overload would let them through.
WRONG_USE = """import npyload

npyload.Loader({"x": "x_*.npy"}, batch_size="64")
npyload.Loader({"x": "x_*.npy"}, 64, prefetch_factor=2)
tl = npyload.Loader({"x": "x_*.npy"}, 64, seed="7", as_tuple=True)
reveal_type(tl)
npyload.Loader({"x": "x_*.npy"}, 64, num_workers="2")
npyload.Loader({"x": "x_*.npy"}, 64, prefetch="4", as_tuple=True)


def firsts(b: npyload.BatchTuple) -> int:
    return b.num_samples


def rows(b: npyload.Batch) -> int:
    return b.num_samples


npyload.Loader({"x": "x_*.npy"}, 64, transform=firsts)
npyload.Loader({"x": "x_*.npy"}, 64, as_tuple=True, transform=rows)
"""
# The last two: a transform for the other batch type (without as_tuple=True
# it gets a Batch, with it a BatchTuple).
WRONG_LINES = {3: '"str"', 4: '"prefetch_factor"', 5: '"str"', 7: '"str"', 8: '"str"',
               19: '"Callable[[BatchTuple], int]"', 20: '"Callable[[Batch], int]"'}
# What mypy says without the plugin: no overload matches, no argument named.
NO_VARIANT = 'No overload variant of "Loader" matches argument types'
# With the plugin (plugins = npyload.mypy_plugin): mypy's ordinary messages,
# one per wrong call, naming the argument; the wrong call keeps its type.
PLUGIN_LINES = {
    3: 'error: Argument "batch_size" to "Loader" has incompatible type "str"; expected "int"',
    4: 'error: Unexpected keyword argument "prefetch_factor" for "Loader"',
    5: 'error: Argument "seed" to "Loader" has incompatible type "str"; expected "int"',
    7: 'error: Argument "num_workers" to "Loader" has incompatible type "Literal[\'2\']"; '
       'expected "int | Literal[\'auto\']"',
    8: 'error: Argument "prefetch" to "Loader" has incompatible type "Literal[\'4\']"; '
       'expected "int | Literal[\'auto\'] | None"',
    19: 'error: Argument "transform" to "Loader" has incompatible type '
        '"Callable[[BatchTuple], int]"; expected "Callable[[Batch], int]"',
    20: 'error: Argument "transform" to "Loader" has incompatible type '
        '"Callable[[Batch], int]"; expected "Callable[[BatchTuple], int]"'}
PLUGIN_REVEAL = (6, 'Revealed type is "npyload._loader.Loader[npyload._batch.BatchTuple]"')
PLUGIN_INI = "[mypy]\nplugins = npyload.mypy_plugin\n"
# Calls mypy accepts, their types revealed (transform's input too, where a
# lambda takes it from the overload): the same lines with the plugin.
REVEAL_USE = """import npyload


def rows(b: npyload.Batch) -> int:
    return b.num_samples


def firsts(b: npyload.BatchTuple) -> int:
    return b.num_samples


f = {"x": "x_*.npy"}
reveal_type(npyload.Loader(f, 64))
reveal_type(npyload.Loader(f, 64, as_tuple=True))
reveal_type(npyload.Loader(f, 64, transform=rows))
reveal_type(npyload.Loader(f, 64, as_tuple=True, transform=firsts))
reveal_type(npyload.Loader(f, 64, transform=lambda b: reveal_type(b)))
reveal_type(npyload.Loader(f, 64, as_tuple=True, transform=lambda b: reveal_type(b)))
reveal_type(npyload.Loader(f, 64, as_tuple=bool(f), transform=None))
reveal_type(npyload.Loader(sources={"a": f}, batch_size=64, seed=1, shuffle="local"))
reveal_type(npyload.Loader(f, 64, num_workers="auto", prefetch="auto", as_tuple=True))
reveal_type(npyload.Loader(f, 64, num_workers=2, prefetch=None))
"""
REVEALS = 12  # the reveal_type calls REVEAL_USE makes (a lambda's may print twice)


@pytest.fixture(scope="module")
def user_mypy(tmp_path_factory):
    """One mypy --strict run over typed_api_use.py, the examples and
    WRONG_USE: (path of the WRONG_USE file, the completed process)."""
    _need_mypy()
    _need_torch_for_mypy()
    assert EXAMPLES, "no examples/*.py"
    d = tmp_path_factory.mktemp("mypy_user")
    # Run outside the checkout (absolute paths) with a fresh cache, so that
    # the installed package is what is checked and nothing is left behind.
    return _mypy_user_files(d, [])


def _mypy_user_files(d, options):
    """mypy --strict (with `options`) in `d` over typed_api_use.py, the
    examples, WRONG_USE and REVEAL_USE: (WRONG_USE's path, the process)."""
    wrong = d / "wrong_use.py"
    wrong.write_text(WRONG_USE)
    (d / "reveal_use.py").write_text(REVEAL_USE)
    out = _run(["mypy", "--strict", *options, "--cache-dir", str(d / "cache"),
                "--no-color-output", str(USE), *map(str, EXAMPLES), str(wrong),
                str(d / "reveal_use.py")], cwd=d)
    return wrong, out


@pytest.fixture(scope="module")
def plugin_mypy(tmp_path_factory):
    """The same mypy --strict run as user_mypy, with the plugin enabled in
    a mypy.ini (as a user would)."""
    _need_mypy()
    _need_torch_for_mypy()
    d = tmp_path_factory.mktemp("mypy_plugin")
    (d / "mypy.ini").write_text(PLUGIN_INI)
    return _mypy_user_files(d, ["--config-file", str(d / "mypy.ini")])


def _checked(out, n=3 + len(EXAMPLES)):
    """mypy's summary says it checked typed_api_use, the examples,
    WRONG_USE and REVEAL_USE (n source files)."""
    return f"checked {n} source file" in out.stdout or f"in {n} source file" in out.stdout


def _errors(out):
    return [ln for ln in out.stdout.splitlines() if ": error:" in ln]


def _lines(out, name, kind=": error:"):
    """{line: [mypy's lines]} of the `kind` lines mypy printed for file `name`."""
    by_line: dict[int, list[str]] = {}
    for ln in out.stdout.splitlines():
        if ln.startswith(f"{name}:") and kind in ln:  # mypy prints it relative to its cwd
            by_line.setdefault(int(ln[len(f"{name}:"):].split(":")[0]), []).append(ln)
    return by_line


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
    by_line = _lines(out, wrong.name)
    assert set(by_line) == set(WRONG_LINES) and _checked(out), out.stdout
    for line, shows in WRONG_LINES.items():
        assert any(shows in ln for ln in by_line[line]), (line, shows, out.stdout)


def test_mypy_without_the_plugin_names_no_argument(user_mypy):
    """Without the plugin mypy's message stays "No overload variant"
    (python/mypy#16725), and a wrong call is typed Any: what the plugin
    changes (docs/python-api.md says both)."""
    wrong, out = user_mypy
    by_line = _lines(out, wrong.name)
    for line in (3, 5, 7, 8):
        assert any(NO_VARIANT in ln for ln in by_line.get(line, [])), (line, out.stdout)
    assert not any(PLUGIN_LINES[line].split("error: ")[1] in out.stdout
                   for line in (3, 5, 7, 8))
    notes = _lines(out, wrong.name, ": note: Revealed type")
    assert notes.get(PLUGIN_REVEAL[0]) == [
        f'{wrong.name}:{PLUGIN_REVEAL[0]}: note: Revealed type is "Any"'], out.stdout


def test_mypy_plugin_names_the_argument(plugin_mypy):
    """With plugins = npyload.mypy_plugin, each wrong call of WRONG_USE
    gets mypy's ordinary message naming the argument (batch_size, seed,
    the unknown keyword, num_workers and prefetch with their "auto", a
    transform with the batch type it must take), once, no "No overload
    variant" and no list of signatures; the wrong as_tuple=True call keeps
    Loader[BatchTuple]."""
    wrong, out = plugin_mypy
    assert out.returncode == 1 and _checked(out), out.stdout + out.stderr
    by_line = _lines(out, wrong.name)
    assert set(by_line) == set(PLUGIN_LINES), out.stdout
    for line, shows in PLUGIN_LINES.items():
        assert len(by_line[line]) == 1 and shows in by_line[line][0], (line, out.stdout)
    assert NO_VARIANT not in out.stdout and "Possible overload variants" not in out.stdout
    line, shows = PLUGIN_REVEAL
    assert [shows in ln for ln in _lines(out, wrong.name, ": note: Revealed")[line]] == [True]


@pytest.mark.parametrize("arg", ["num_workers", "prefetch"])
@pytest.mark.parametrize("value", ["2", "AUTO", b"auto", 2.0])
def test_counts_take_an_int_or_auto_at_run_time(tmp_path, arg, value):
    """What mypy refuses (WRONG_USE's num_workers="2") is refused at run
    time too, by a TypeError naming the argument and its two forms; "auto"
    and ints are taken."""
    np.save(tmp_path / "x_0000.npy", np.arange(8, dtype=np.float32))
    fields = {"x": str(tmp_path / "x_*.npy")}
    with pytest.raises(TypeError, match=rf"^{arg} must be an int or 'auto', got "):
        npyload.Loader(fields, 4, output="numpy", **{arg: value})
    for ok in ("auto", 1):
        with npyload.Loader(fields, 4, output="numpy", **{arg: ok}) as ld:
            assert getattr(ld, arg) == ok and sum(b.num_samples for b in ld) == 8


def test_mypy_plugin_reveals_the_same_types(user_mypy, plugin_mypy):
    """REVEAL_USE (calls mypy accepts, lambdas taking transform's input
    from the overload) prints the same lines with and without the plugin."""
    lines = [[ln for ln in out.stdout.splitlines() if ln.startswith("reveal_use.py:")]
             for _, out in (user_mypy, plugin_mypy)]
    assert len([ln for ln in lines[0] if "Revealed type is" in ln]) >= REVEALS, lines[0]
    assert lines[1] == lines[0]
    assert PLUGIN_LINES[3] in plugin_mypy[1].stdout, plugin_mypy[1].stdout  # it was active


def test_mypy_plugin_keeps_every_type(plugin_mypy):
    """With the plugin, typed_api_use.py and the examples pass mypy --strict
    as they do without it: every assert_type there (Loader[Batch],
    Loader[BatchTuple], Loader[R], transform's input Batch or BatchTuple,
    the types of iteration) holds, so the plugin changes no type of a call
    mypy accepts. (The plugin was active: it named batch_size.)"""
    wrong, out = plugin_mypy
    others = [ln for ln in _errors(out) if not ln.startswith(f"{wrong.name}:")]
    assert others == [] and _checked(out), f"mypy --strict with the plugin:\n{out.stdout}{out.stderr}"
    assert PLUGIN_LINES[3] in out.stdout, out.stdout


# The plugin as it would run where mypy's internals differ: the checker has
# no expr_checker (nor local_type_map). It must leave mypy's ordinary
# messages, never crash it.
BROKEN_PLUGIN = """from npyload import mypy_plugin


class _OtherMypy:
    def __init__(self, api):
        self._api = api

    def __getattr__(self, name):
        if name in ("expr_checker", "local_type_map"):
            raise AttributeError(name)
        return getattr(self._api, name)


class Broken(mypy_plugin.NpyloadPlugin):
    def _loader_signature(self, ctx):
        return super()._loader_signature(ctx._replace(api=_OtherMypy(ctx.api)))


def plugin(version):
    return Broken
"""


def test_mypy_plugin_fails_soft(tmp_path):
    """Without the internals it uses, the plugin leaves the call to mypy's
    overload check: the same messages as without the plugin, no crash.
    (torch is not followed here: WRONG_USE's types do not involve it.)"""
    _need_mypy()
    wrong = tmp_path / "wrong_use.py"
    wrong.write_text(WRONG_USE)
    (tmp_path / "broken_plugin.py").write_text(BROKEN_PLUGIN)
    (tmp_path / "mypy.ini").write_text(
        f"[mypy]\nplugins = {tmp_path / 'broken_plugin.py'}\n"
        "[mypy-torch.*]\nfollow_imports = skip\n")
    out = _run(["mypy", "--strict", "--config-file", str(tmp_path / "mypy.ini"),
                "--cache-dir", str(tmp_path / "cache"), "--no-color-output", str(wrong)],
               cwd=tmp_path)
    assert out.returncode == 1 and _checked(out, 1), out.stdout + out.stderr
    assert "INTERNAL ERROR" not in out.stdout + out.stderr, out.stdout + out.stderr
    by_line = _lines(out, wrong.name)
    assert set(by_line) == set(WRONG_LINES), out.stdout
    for line in (3, 5, 7, 8):
        assert any(NO_VARIANT in ln for ln in by_line[line]), (line, out.stdout)


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
    defaults (`...` where an overload needs a value given; the BatchTuple
    overloads require as_tuple=True by keyword)."""
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
            allowed = (w, "...", None) if n == "as_tuple" else (w, "...")
            assert d in allowed, f"overload at line {f.lineno}: {n} = {d}, not {w}"
        if ("as_tuple", None) in got:  # required: keyword-only, not positional
            assert "as_tuple" in [k.arg for k in f.args.kwonlyargs], f.lineno


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
