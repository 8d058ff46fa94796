"""``python -m npyload info`` and ``npyload.build_info()`` (issue 25, item 3),
checked against truths found without npyload: the build directory's CMake
cache, a loader actually started on io_uring, the libzstd mapped into this
process (asked through ctypes), the CUDA runtimes the dynamic loader finds
(ctypes), /proc/cpuinfo, a loader started with every default, and the
installed distributions' metadata.

The installed package was built by pip in a directory of its own; the
build directory (NPYLOAD_BUILD_DIR, see conftest.py) was configured on the
same machine against the same system libraries, so its cache says what
CMake found for both."""
import ctypes
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import npyload
from npyload import _npyload

REPO = Path(__file__).resolve().parents[2]
CUDART_SONAMES = ["libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"]


def _build_dir():
    b = Path(os.environ.get("NPYLOAD_BUILD_DIR", REPO / "build"))
    if not b.is_absolute() and not b.exists():
        b = REPO / b
    return b


def _cmake_cache(name):
    cache = _build_dir() / "CMakeCache.txt"
    if not cache.is_file():
        pytest.fail(f"{cache} not found: configure the build first or point "
                    f"NPYLOAD_BUILD_DIR at it", pytrace=False)
    m = re.search(rf"^{name}:[A-Z]+=(.*)$", cache.read_text(), re.M)
    assert m, f"{name} is not in {cache}"
    return m.group(1)


@pytest.fixture(scope="module")
def info():
    return npyload.build_info()


@pytest.fixture(scope="module")
def text():
    out = subprocess.run([sys.executable, "-m", "npyload", "info"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr
    return out.stdout


def _line(text, label):
    """The value of the line 'label:   value' of the info block."""
    for ln in text.splitlines():
        if ln.startswith(label + ":"):
            return ln[len(label) + 1:].strip()
    raise AssertionError(f"no '{label}:' line in:\n{text}")


def _mapped(substr):
    """Paths of the files mapped into this process whose name holds substr."""
    with open("/proc/self/maps") as f:
        return sorted({ln.split()[-1] for ln in f if "/" in ln and substr in ln.split()[-1]})


def test_version(info, text):
    assert info["version"] == npyload.__version__
    assert text.splitlines()[0] == f"npyload {npyload.__version__}"


def test_uring_compiled_in_agrees_with_the_cmake_cache(info, text):
    built = _cmake_cache("NPYLOAD_BUILT_WITH_URING") == "ON"
    assert info["uring_compiled"] is built
    line = _line(text, "io_uring")
    assert line.startswith("compiled in" if built else "not compiled in"), line
    if built:
        assert info["liburing_version"] and f"liburing {info['liburing_version']}" in line


def test_uring_usable_agrees_with_a_loader_on_io_uring(info, text, tmp_path):
    np.save(tmp_path / "x_0000.npy", np.arange(16, dtype=np.float32).reshape(8, 2))
    glob = str(tmp_path / "x_*.npy")
    try:
        with npyload.Loader({"x": glob}, 4, io="uring", num_workers=1, output="numpy") as ld:
            assert ld.backend == "io_uring"
            next(iter(ld))
        started, why = True, ""
    except npyload.NpyloadError as e:
        assert e.code == _npyload.ENOURING, e
        started, why = False, str(e)
    assert info["uring_usable"] is started, why
    line = _line(text, "io_uring")
    if started:
        assert info["uring_why"] == "" and line.endswith("usable here"), line
    else:
        # the kernel's answer (or "built without liburing") is given
        assert info["uring_why"] and info["uring_why"] in line and "NOT usable" in line
    # io='auto' picks what the info says it picks here
    with npyload.Loader({"x": glob}, 4, io="auto", num_workers=1, output="numpy") as ld:
        assert ld.backend == info["default_io_backend"]
    assert info["default_io_backend"] == ("io_uring" if started else "pread")


def _npyload_zstd():
    """The libzstd the npyload extension resolves (ldd), among those mapped
    into this process: torch or another wheel may map a libzstd of its own."""
    import npyload._npyload as ext
    libs = _mapped("libzstd")
    try:
        out = subprocess.run(["ldd", ext.__file__], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for ln in out.splitlines():
        if "libzstd" in ln and "=>" in ln:
            path = os.path.realpath(ln.split("=>")[1].split("(")[0].strip())
            same = [p for p in libs if os.path.realpath(p) == path]
            if same:
                return same[0]
    return libs[0] if len(libs) == 1 else None


def test_zstd_versions_are_those_of_the_loaded_library(info, text):
    libzstd = _npyload_zstd()
    if not libzstd:
        pytest.skip("no libzstd of npyload's is mapped into this process (linked "
                    "statically?)")
    lib = ctypes.CDLL(libzstd)
    lib.ZSTD_versionString.restype = ctypes.c_char_p
    lib.ZSTD_versionNumber.restype = ctypes.c_uint
    loaded = lib.ZSTD_versionString().decode()
    n = lib.ZSTD_versionNumber()
    assert loaded == f"{n // 10000}.{n // 100 % 100}.{n % 100}"
    assert info["zstd_loaded"] == loaded
    # Built against: the libzstd.pc that CMake's pkg_check_modules read.
    m = re.search(r"^ZSTD_VERSION:INTERNAL=(.*)$", (_build_dir() / "CMakeCache.txt").read_text(),
                  re.M)
    if m:
        assert info["zstd_compiled"] == m.group(1)
    else:
        assert re.fullmatch(r"\d+\.\d+\.\d+", info["zstd_compiled"]), info["zstd_compiled"]
    assert _line(text, "zstd").startswith(f"{loaded} loaded, built against "
                                          f"{info['zstd_compiled']}")


def _first_loadable_cudart():
    for name in CUDART_SONAMES:
        try:
            return name, ctypes.CDLL(name)
        except OSError:
            continue
    return None, None


def test_cuda_runtime_agrees_with_the_dynamic_loader(info, text):
    name, lib = _first_loadable_cudart()
    line = _line(text, "CUDA runtime")
    if lib is None:
        assert info["cuda_runtime_found"] is False
        assert info["cuda_runtime_path"] == "" and info["cuda_devices"] == 0
        assert "no CUDA runtime library (libcudart) found" in info["cuda_why"], info["cuda_why"]
        assert line == "not found"
        assert _line(text, "CUDA devices") == f"none: {info['cuda_why']}"
        return
    assert info["cuda_runtime_found"] is True
    v = ctypes.c_int(0)
    if info["cuda_driver_version"] == "":
        # No driver: the search stops at the first runtime that loads.
        assert info["cuda_runtime_soname"] == name
    else:
        # With a driver, a runtime too new for it is passed over: the one
        # reported must load too.
        lib = ctypes.CDLL(info["cuda_runtime_soname"])
    assert lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0
    want = f"{v.value // 1000}.{v.value % 1000 // 10}"
    assert info["cuda_runtime_version"] == want
    paths = [p for p in _mapped("libcudart") if os.path.exists(p)]
    real = {os.path.realpath(p) for p in paths}
    assert os.path.realpath(info["cuda_runtime_path"]) in real, (info["cuda_runtime_path"], paths)
    assert line == f"{info['cuda_runtime_path']} (CUDA {want})"
    ok, why = npyload.cuda_available()
    assert (info["cuda_devices"] > 0) is ok
    if not ok:
        assert info["cuda_why"] == why
        assert _line(text, "CUDA devices") == f"none: {why}"
    else:
        assert _line(text, "CUDA devices").startswith(f"{info['cuda_devices']} (driver ")


def test_device_kernels_follow_the_wheels_build_options(info, text):
    """pip builds with pyproject.toml's NPYLOAD_CUDA_KERNELS: AUTO embeds a
    fatbin when nvcc is found and the source for NVRTC always, so the
    wheel has device kernels whether or not nvcc was there; the line says
    which, and where NVRTC is (or what to install)."""
    pyproject = (REPO / "pyproject.toml").read_text()
    m = re.search(r'^NPYLOAD_CUDA_KERNELS\s*=\s*"(\w+)"', pyproject, re.M)
    mode = m.group(1) if m else "AUTO"
    line = _line(text, "device transforms")
    assert info["transform_nvrtc"] is (mode != "OFF")
    if info["nvrtc_found"]:
        assert info["nvrtc_why"] == "" and "libnvrtc" in info["nvrtc_path"]
        assert re.fullmatch(r"\d+\.\d+", info["nvrtc_version"])
        nv = f"NVRTC {info['nvrtc_version']} at run time ({info['nvrtc_path']})"
    else:
        assert info["nvrtc_path"] == "" and info["nvrtc_version"] == ""
        if info["transform_nvrtc"]:
            assert "pip install nvidia-cuda-nvrtc" in info["nvrtc_why"]
    if info["transform_kernels"]:
        assert info["transform_kernels_why"] == ""
        assert re.fullmatch(r"(sm_\d+ )+compute_\d+", info["transform_kernel_archs"])
        aot = f"ahead of time (embedded fatbin: {info['transform_kernel_archs']})"
        if info["nvrtc_found"]:
            assert line == f"{aot}; other GPUs: {nv}"
        else:
            assert line == f"{aot}; other GPUs: NVRTC not found (pip install nvidia-cuda-nvrtc)"
    else:
        assert info["transform_kernel_archs"] == ""
        assert "nvcc" in info["transform_kernels_why"] or mode == "OFF"
        if info["nvrtc_found"]:
            assert line == f"{nv}; no ahead-of-time kernels: {info['transform_kernels_why']}"
        else:
            assert line.startswith(f"unavailable: {info['transform_kernels_why']}")
    if mode == "NVRTC":
        assert info["transform_kernels"] is False


def test_f16c_agrees_with_proc_cpuinfo(info, text):
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert info["f16c_compiled"] is x86
    flags = set()
    with open("/proc/cpuinfo") as f:
        for ln in f:
            if ln.startswith("flags"):
                flags = set(ln.split(":", 1)[1].split())
                break
    has = x86 and {"f16c", "avx"} <= flags
    assert info["f16c_used"] is has
    line = _line(text, "CPU features")
    assert ("used (this CPU has it)" in line) is has, line


def test_defaults_are_what_a_default_loader_runs_with(info, text, tmp_path):
    np.save(tmp_path / "x_0000.npy", np.arange(64, dtype=np.float32).reshape(32, 2))
    c = _npyload.Loader()
    c.add_field("x", str(tmp_path / "x_*.npy"))
    c.set(_npyload.OPT_BATCH_SIZE, 4)
    c.set(_npyload.OPT_SHUFFLE, _npyload.SHUFFLE_LOCAL)
    c.start()
    try:
        assert info["default_num_workers"] == c.get(_npyload.OPT_NUM_WORKERS)
        # PREFETCH auto starts at the workers' fill plus the held slot, the
        # default's ready slot added when the loop waits for it (issue 37)
        assert c.get(_npyload.OPT_PREFETCH) == info["default_num_workers"] + 1
        assert c.get(_npyload.OPT_PREFETCH) <= info["default_prefetch"]
        assert info["default_queue_depth"] == c.get(_npyload.OPT_QUEUE_DEPTH)
        assert info["default_shuffle_window"] == c.get(_npyload.OPT_SHUFFLE_WINDOW)
        assert info["default_io_backend"] == c.backend
    finally:
        c.close()
    assert info["default_prefetch"] == _npyload.default_prefetch(0)
    # Python's Loader: the same worker count by default, prefetch = slots - 1
    with npyload.Loader({"x": str(tmp_path / "x_*.npy")}, 4, output="numpy") as ld:
        next(iter(ld))  # the C loader starts at the first iter()
        assert ld._c.get(_npyload.OPT_NUM_WORKERS) == info["default_num_workers"]
        assert ld._c.get(_npyload.OPT_PREFETCH) == info["default_num_workers"] + 1
        assert ld.stats()["num_workers"] == info["default_num_workers"]
    assert info["default_read_ahead"] is True
    line = _line(text, "defaults")
    assert line == (f"num_workers {info['default_num_workers']}, prefetch "
                    f"{info['default_prefetch'] - 1} (C: PREFETCH {info['default_prefetch']} "
                    f"slots), queue depth {info['default_queue_depth']} per worker, io auto -> "
                    f"{info['default_io_backend']} here, read-ahead on, shuffle window "
                    f"{info['default_shuffle_window']} files"), line


def test_python_numpy_torch_versions(info, text):
    assert info["python"] == platform.python_version()
    assert _line(text, "Python").startswith(platform.python_version() + " (")
    assert info["numpy"] == np.__version__ == _line(text, "numpy")
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    assert info["torch"] == torch
    assert _line(text, "torch") == (torch or "not installed")


def test_info_does_not_import_torch():
    code = ("import sys, npyload\n"
            "npyload.build_info()\n"
            "assert 'torch' not in sys.modules, 'build_info imported torch'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("args", [[], ["bogus"], ["info", "extra"]])
def test_usage_and_exit_2_without_a_known_subcommand(args):
    out = subprocess.run([sys.executable, "-m", "npyload", *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stdout == ""
    assert "usage: python -m npyload info" in out.stderr
    if args:
        assert "unknown command" in out.stderr


def test_bench_prints_the_same_block_first_and_puts_it_in_its_json(info, text, tmp_path):
    """npyload-bench (tools/npyload_info_print.c, built in the build dir)
    starts with the lines of `python -m npyload info` (all but system,
    Python, numpy and torch, which are Python's), and its JSON's build_info
    holds the same facts as npyload.build_info()."""
    from conftest import built_tool
    bench = built_tool("npyload-bench")
    (tmp_path / "x").mkdir()
    for i in range(2):
        np.save(tmp_path / "x" / f"x_{i:04d}.npy", np.ones((8, 4), np.float32))
    out_json = tmp_path / "b.json"
    p = subprocess.run([bench, f"x={tmp_path}/x/*.npy", "--workers", "1", "--prefetch", "2",
                        "--io", "pread", "--batches", "2", "--batch-size", "4",
                        "--json", str(out_json)], capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout + p.stderr
    # The bench links the build dir's library, the package the wheel's: the
    # two are built with different options (the wheel's NPYLOAD_GPU_TESTS,
    # test_device_kernels_follow_the_wheels_build_options), so the device
    # transforms line may differ; every other fact is the same.
    kern = "device transforms:"
    py = [ln for ln in text.splitlines()
          if not ln.startswith(("system:", "Python:", "numpy:", "torch:"))]
    got = p.stdout.splitlines()[:len(py)]
    assert [ln for ln in got if not ln.startswith(kern)] == \
        [ln for ln in py if not ln.startswith(kern)], "\n".join(got)
    assert any(ln.startswith(kern) for ln in got)
    import json
    doc = json.loads(out_json.read_text())
    skip = ("python", "numpy", "torch", "transform_kernels", "transform_kernels_why",
            "transform_kernel_archs", "transform_nvrtc", "nvrtc_found", "nvrtc_version",
            "nvrtc_path", "nvrtc_why")
    want = {k: v for k, v in info.items() if k not in skip}
    assert {k: v for k, v in doc["build_info"].items() if k not in skip} == want
