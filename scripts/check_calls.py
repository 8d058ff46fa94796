#!/usr/bin/env python3
"""Calls go down, checked on the calls: reads the object files of a build
with nm and fails when

  * a unit calls (or reads a global of) a unit that its rule set does not
    allow (lib/CMakeLists.txt declares the modules' order, NPYL_DEPS_<m>, and
    lib/loader's parts, NPYL_LOADER_INC_<part>), or
  * the files call each other in a circle (a file that calls a second file
    that calls, directly or not, the first), anywhere in the manifest.

An include check (lib/CMakeLists.txt, at configure time) sees what a file
may name; this one sees what it does call: a public function called through
include/npyload.h, or a declaration copied by hand, shows up here.

    check_calls.py MANIFEST [MANIFEST...]

A manifest is JSON written by CMake (file(GENERATE)): {"rulesets": [{"name":
..., "units": [{"name": ..., "deps": [...], "objects": [...]}]}], "objects":
[...]}. "objects" at the top adds files to the circle check only. Symbols
defined outside the manifest (libc, libcurl, Python) are not checked.
Exit status 0 when every rule holds, 1 with one line per violation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys


def symbols(obj: str) -> tuple[set[str], set[str]]:
    """(defined globals, undefined) of one object file."""
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind in "Uwv":
            undefined.add(name)
        elif kind.isupper():
            defined.add(name)
    return defined, undefined


def short(path: str) -> str:
    """A file's name without the build tree's prefix and the object suffix."""
    base = path.split(".dir/", 1)[-1]
    return base[:-2] if base.endswith(".o") else base


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan,
    iterative), each as a cycle-ish list of its members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def parts_ruleset(spec: dict) -> dict:
    """A module's files grouped into parts by name (PREFIX<part>.c): each
    part may call the parts listed for it; a file whose part is not listed
    is the module's top layer, which may call every part."""
    units = {name: {"name": name, "deps": deps, "objects": []}
             for name, deps in spec["parts"].items()}
    top = {"name": "top", "deps": sorted(units), "objects": []}
    for o in spec["objects"]:
        if not o:
            continue
        base = os.path.basename(o).split(".", 1)[0]
        part = base[len(spec["prefix"]):] if base.startswith(spec["prefix"]) else ""
        units.get(part, top)["objects"].append(o)
    return {"name": spec["name"], "units": list(units.values()) + [top]}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    rulesets, loose = [], []
    for path in argv[1:]:
        with open(path) as f:
            m = json.load(f)
        rulesets += m.get("rulesets", [])
        loose += [o for o in m.get("objects", []) if o]
        if "parts" in m:
            rulesets.append(parts_ruleset(m["parts"]))
    objs: set[str] = set(loose)
    for rs in rulesets:
        for u in rs["units"]:
            u["objects"] = [o for o in u["objects"] if o]
            objs.update(u["objects"])
    missing = sorted(o for o in objs if not os.path.exists(o))
    if missing:
        print(f"check_calls: {len(missing)} object files missing (build first), e.g. "
              f"{missing[0]}", file=sys.stderr)
        return 2
    defs: dict[str, set[str]] = {}
    undef: dict[str, set[str]] = {}
    owner: dict[str, str] = {}
    for o in sorted(objs):
        d, u = symbols(o)
        defs[o], undef[o] = d, u
        for s in d:
            owner.setdefault(s, o)
    # The files each file calls (symbols defined by another file).
    calls: dict[str, dict[str, set[str]]] = {}
    for o in objs:
        for s in undef[o]:
            t = owner.get(s)
            if t is not None and t != o:
                calls.setdefault(o, {}).setdefault(t, set()).add(s)
    bad: list[str] = []
    for rs in rulesets:
        unit_of = {}
        for u in rs["units"]:
            for o in u["objects"]:
                unit_of[o] = u
        for u in rs["units"]:
            allowed = set(u.get("deps", [])) | {u["name"]}
            for o in u["objects"]:
                for t, syms in sorted(calls.get(o, {}).items()):
                    v = unit_of.get(t)
                    if v is None or v["name"] in allowed:
                        continue
                    bad.append(f"{rs['name']}: {short(o)} ({u['name']}) calls "
                               f"{', '.join(sorted(syms)[:4])} of {short(t)} "
                               f"({v['name']}), which '{u['name']}' may not use "
                               f"(allowed: {', '.join(sorted(allowed - {u['name']})) or 'none'})")
    edges = {o: set(ts) for o, ts in calls.items()}
    for comp in circles(edges):
        members = set(comp)
        hops = []
        for a in comp:
            for b in sorted(edges.get(a, ())):
                if b in members:
                    hops.append(f"{short(a)} -> {short(b)} "
                                f"({', '.join(sorted(calls[a][b])[:3])})")
        bad.append("circle of files: " + "; ".join(hops))
    for line in bad:
        print(line)
    if bad:
        print(f"check_calls: {len(bad)} violation(s): calls must go down "
              "(ARCHITECTURE.md, 'Calls go down')", file=sys.stderr)
        return 1
    print(f"check_calls: {len(objs)} object files, {len(rulesets)} rule sets: "
          "calls go down, no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
