#!/usr/bin/env python3
"""What libnpyload exports is declared in include/npyload.h, the only public
header, and the entry points only npyload's tools and tests use (the compute
simulator, NVML, the ranged-GET sweep) are declared in its experimental part
only (after "==== Experimental API", under NPYLOAD_EXPERIMENTAL), never in
the stable part; no bench scaffolding is exported at all.

    check_exports.py NM LIBNPYLOAD_SO INCLUDE_DIR
"""
import os
import re
import subprocess
import sys

TOOLS_ONLY = re.compile(r"npyload_(compute_sim|nvml|rget)\w*")


def main(nm, lib, inc):
    bad = []
    extra = sorted(set(os.listdir(inc)) - {"npyload.h"})
    if extra:
        bad.append(f"{inc} holds more than npyload.h: {extra}")
    header = open(os.path.join(inc, "npyload.h")).read()
    marker = header.find("==== Experimental API")
    if marker < 0:
        bad.append("npyload.h has no experimental part")
        marker = len(header)
    stable, experimental = header[:marker], header[marker:]
    for name in sorted({m.group(0) for m in TOOLS_ONLY.finditer(stable)}):
        bad.append(f"{name}: a tools-only entry point in npyload.h's stable part")
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True, capture_output=True,
                         text=True).stdout
    exported = sorted({line.split()[-1] for line in out.splitlines()
                       if line.split() and line.split()[-1].startswith("npyload_")})
    for name in exported:
        if re.search(r"bench|support", name):
            bad.append(f"{name}: bench scaffolding exported by the library")
        elif not re.search(r"\b" + re.escape(name) + r"\s*\(", header):
            bad.append(f"{name}: exported but not declared in npyload.h")
        elif TOOLS_ONLY.fullmatch(name) and not re.search(r"\b" + re.escape(name) + r"\s*\(",
                                                          experimental):
            bad.append(f"{name}: tools-only but not in npyload.h's experimental part")
    for line in bad:
        print(line)
    if not exported:
        print(f"{lib}: no npyload_ symbol exported (nm failed?)")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
