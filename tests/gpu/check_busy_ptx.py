"""Assembles the compute simulator's embedded PTX (lib/cuda/npyload_cuda_sim.c)
with ptxas for the GPUs we target, so a broken kernel is caught on machines
without a GPU. Usage: check_busy_ptx.py SOURCE PTXAS"""
import re
import subprocess
import sys
import tempfile

src, ptxas = sys.argv[1], sys.argv[2]
text = open(src).read()
start = text.index("BUSY_PTX[] =")
body = text[start:text.index(";\n", start)]
ptx = "".join(s.encode().decode("unicode_escape")
              for s in re.findall(r'"((?:[^"\\]|\\.)*)"', body))
with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
    f.write(ptx)
failed = 0
for arch in ("sm_75", "sm_80", "sm_90"):
    r = subprocess.run([ptxas, f"-arch={arch}", f.name, "-o", "/dev/null"],
                       capture_output=True, text=True)
    ok = r.returncode == 0
    failed += not ok
    print(f"busy kernel PTX for {arch}: {'ok' if ok else 'FAILED ' + r.stderr}")
print(f"{3 - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
