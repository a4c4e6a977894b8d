#!/usr/bin/env python3
"""The include / import graph of src/, include/meshmuon/ and python/meshmuon against the layer order
written down once, here (docs/design.md, "Layers as folders", shows the same order):

  C++ (bottom first): a file may include headers of its own layer and of the layers below it,
  never one above; no two files may include each other through a cycle. A backend's folder
  (src/backend/<name>/) is private to it: other files include only its shared/ subfolder (the device
  helpers its transports need too, e.g. backend/cuda/shared/device_guard.h for comm/nccl/).
  Python: no module of the meshmuon package imports another in a cycle.

Run: python3 scripts/check_layers.py [--graph] [--root DIR]   (make test runs it through
tests/python/test_layers.py, with a negative control; exit 1 on a violation)
"""
from __future__ import annotations

import ast
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The layers, bottom first: each one a folder of src/ and the public headers that are its contract.
LAYERS: list[tuple[str, list[str]]] = [
    ("core", ["dtype.h", "bf16.h", "tensor.h", "error.h", "export.h", "version.h", "device.h"]),
    ("kernels", ["blas.h", "orthogonalize.h", "update.h", "qk_clip.h"]),
    ("layout", ["mesh.h", "placement.h", "box.h"]),
    ("inventory", ["param_spec.h", "inventory.h"]),
    ("plan", ["strategy.h", "plan.h"]),
    ("backend", []),
    ("comm", ["comm.h", "comm_transport.h", "comm_nccl.h", "mesh_comms.h"]),
    ("state", ["state_hooks.h"]),
    ("fsdp", ["sharded_params.h"]),
    ("exec", ["optim_options.h", "local_optimizer.h", "optimizer.h"]),
    ("checkpoint", ["checkpoint.h"]),
]
LEVEL = {name: i for i, (name, _) in enumerate(LAYERS)}
HEADER_LAYER = {h: name for name, headers in LAYERS for h in headers}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of_src(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "src" and len(rel.parts) > 2:
        return rel.parts[1]
    if rel.parts[:2] == ("include", "meshmuon"):
        return HEADER_LAYER.get(rel.name)
    return None


def private_backend_folder(target: Path) -> Path | None:
    """The backend folder src/backend/<name>/ a header is private to; None for a header of a shared/
    subfolder, or outside any backend's folder."""
    rel = target.relative_to(ROOT) if target.is_relative_to(ROOT) else None
    if rel is None or rel.parts[:2] != ("src", "backend") or len(rel.parts) < 4:
        return None
    if len(rel.parts) >= 5 and rel.parts[3] == "shared":
        return None
    return ROOT / "src" / "backend" / rel.parts[2]


def resolve(inc: str, where: Path) -> Path | None:
    for base in (ROOT / "include", ROOT / "src", where.parent):
        p = base / inc
        if p.exists():
            return p.resolve()
    return None


def cpp_violations() -> list[str]:
    files = [p for d in ("src", "include/meshmuon") for p in (ROOT / d).rglob("*")
             if p.suffix in (".h", ".cpp", ".cuh", ".cu")]
    problems, graph = [], defaultdict(set)
    for f in files:
        mine = layer_of_src(f)
        if mine is None and f.parent.name == "meshmuon":
            problems.append(f"{f.relative_to(ROOT)}: a public header of no layer (add it to LAYERS in {Path(__file__).name})")
            continue
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            target = resolve(inc, f)
            if target is None:
                continue  # a system or third-party header
            graph[f.resolve()].add(target)
            theirs = layer_of_src(target)
            if mine is None or theirs is None:
                continue
            if LEVEL.get(theirs, -1) > LEVEL.get(mine, 99):
                problems.append(f"{f.relative_to(ROOT)} ({mine}) includes {inc} ({theirs}): a layer above it")
            private = private_backend_folder(target)
            if private is not None and not f.resolve().is_relative_to(private):
                problems.append(f"{f.relative_to(ROOT)} includes {inc}: a private header of "
                                f"{private.relative_to(ROOT)}/ (include its shared/ folder only)")
    problems += [f"include cycle: {' -> '.join(str(Path(p).relative_to(ROOT)) for p in c)}" for c in cycles(graph)]
    return problems


def python_violations() -> list[str]:
    pkg = ROOT / "python" / "meshmuon"
    modules = {}
    for p in pkg.rglob("*.py"):
        rel = p.relative_to(pkg.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = p
    graph = defaultdict(set)
    for name, p in modules.items():
        package = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
                targets = [stem] + [f"{stem}.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                if t in modules and t != name and not is_package_parent(t, name):
                    graph[name].add(t)
    return [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]


def is_package_parent(target: str, name: str) -> bool:
    """`from . import x` inside package p names p itself; a module importing its own package's
    __init__ (for a sibling) is not an edge to the package's contents."""
    return name.startswith(target + ".")


def cycles(graph: dict) -> list[list]:
    """One representative cycle per strongly connected component with more than one node."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    global ROOT
    if "--root" in sys.argv:
        ROOT = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
    problems = cpp_violations() + python_violations()
    if "--graph" in sys.argv:
        print("layers, bottom first:", " < ".join(name for name, _ in LAYERS))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) of the layer order", file=sys.stderr)
        return 1
    print(f"check_layers: ok ({' < '.join(name for name, _ in LAYERS)}; no include or import cycle)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
