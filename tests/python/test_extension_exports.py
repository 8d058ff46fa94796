"""The extension exports only its init function: the library inside it
(linked statically) stays private, so a process that also loads
libnpyload.so never binds to the extension's copy, and no bench or test
scaffolding ships in it."""
import shutil
import subprocess

import pytest

import npyload._npyload as ext


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) not installed")
def test_extension_exports_only_its_init():
    out = subprocess.run(["nm", "-D", "--defined-only", ext.__file__],
                         capture_output=True, text=True, check=True).stdout
    text = [line.split()[-1] for line in out.splitlines()
            if len(line.split()) == 3 and line.split()[1] in ("T", "D", "B", "W")]
    assert text == ["PyInit__npyload"], text
    # Nothing of the bench's scaffolding is defined or needed (the wheel is
    # stripped, so the dynamic table is what can be read).
    dyn = subprocess.run(["nm", "-D", ext.__file__], capture_output=True, text=True,
                         check=True).stdout.lower()
    for word in ("bench", "compute_sim", "h2d_bandwidth", "nvml"):
        assert word not in dyn, word
