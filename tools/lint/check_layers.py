#!/usr/bin/env python3
"""The include / import graph of src/, include/meshmuon/, the frontends (python/src, tools/cli) and
python/meshmuon against the layer order written down once, here (docs/architecture.md, "The layers",
shows the same order):

  C++ (bottom first): a file may include headers of its own layer and of the layers below it,
  never one above; no two files may include each other through a cycle. A backend's folder
  (src/backend/<name>/) is private to it: other files include only its shared/ subfolder (the device
  helpers its transports need too, e.g. backend/cuda/shared/device_guard.h for comm/nccl/) or a layer
  that lives inside it (the cpu kernels: src/backend/cpu/kernels/, the kernels layer, see FOLDERS).
  Public headers: include/meshmuon/X.h is drawn in the folder of the sources that implement it
  (tools/lint/header_homes.py finds them by what they define), so every one of them lies in the
  header's layer and one is named X.cpp (mlx's rule): a header implemented elsewhere would draw
  an arrow back up (or down) the house. A header that declares nothing out of line (export.h,
  version.h) has no source and stays in its layer.
  Frontends (above every layer, side by side): any public header; their own folder's headers;
  internal src/ headers only of the layers up to FRONTENDS' limit; never another frontend's.
  Python: no module of the meshmuon package imports another in a cycle.

Run: python3 tools/lint/check_layers.py [--graph] [--root DIR]   (make test runs it through
tests/python/test_layers.py, with negative controls; exit 1 on a violation)
"""
from __future__ import annotations

import ast
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from header_homes import implementers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

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
# The frontends, above every layer: folder -> the highest layer whose internal (src/) headers it may
# include. The nanobind module binds the public contracts; it reaches into core and kernels only to
# report the CPU's features and the bf16 product path (meshmuon.cpu_info). The CLI's bench commands
# time kernels and backends directly and `meshmuon info` lists the registered backends and
# transports, so it may include internal headers up to comm; the engine's rooms above (state, fsdp,
# exec, checkpoint) only through their public headers.
FRONTENDS: dict[str, str] = {"python/src": "kernels", "tools/cli": "comm"}
LEVEL = {name: i for i, (name, _) in enumerate(LAYERS)}
HEADER_LAYER = {h: name for name, headers in LAYERS for h in headers}
# A layer's folder under src/ is its name, except: the cpu kernels live with the cpu backend (as mlx keeps
# backend/cpu) but are a layer of their own, right above core, because the planner's flops and the
# public rules headers (orthogonalize.h, update.h, qk_clip.h) read them and the cuda backend reuses
# their scalar formulas; they include nothing of the backend layer.
FOLDERS: dict[str, str] = {"kernels": "backend/cpu/kernels"}


def folder(layer: str) -> str:
    return FOLDERS.get(layer, layer)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def frontend_of(path: Path) -> str | None:
    rel = path.relative_to(ROOT).as_posix()
    return next((f for f in FRONTENDS if rel.startswith(f + "/")), None)


def layer_of_src(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "src" and len(rel.parts) > 2:
        for layer, f in FOLDERS.items():
            if rel.parts[1:1 + len(Path(f).parts)] == Path(f).parts:
                return layer
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
    if len(rel.parts) >= 5 and rel.parts[3] == "shared" or layer_of_src(ROOT / rel) != "backend":
        return None
    return ROOT / "src" / "backend" / rel.parts[2]


def resolve(inc: str, where: Path) -> Path | None:
    for base in (ROOT / "include", ROOT / "src", where.parent):
        p = base / inc
        if p.exists():
            return p.resolve()
    return None


def cpp_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*")
                  if p.suffix in (".h", ".cpp", ".cuh", ".cu"))


def cpp_violations() -> list[str]:
    files = cpp_files("src", "include/meshmuon", *FRONTENDS)
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
            if (front := frontend_of(f)) is not None:
                problems += frontend_include(f, front, inc, target)
                continue
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


def frontend_include(f: Path, front: str, inc: str, target: Path) -> list[str]:
    """A frontend's include: public headers and its own files always; internal headers up to its limit."""
    where = f"{f.relative_to(ROOT)} ({front})"
    other = frontend_of(target)
    if other is not None and other != front:
        return [f"{where} includes {inc} of the frontend {other}: frontends stand side by side, "
                "share code through a layer instead"]
    theirs = layer_of_src(target)
    if other is None and theirs is None:
        return []  # outside the house (a test helper, a generated header)
    if target.parent == (ROOT / "include" / "meshmuon").resolve() or other == front:
        return []
    limit = FRONTENDS[front]
    if LEVEL[theirs] > LEVEL[limit]:
        return [f"{where} includes {inc}, an internal header of {theirs}: a frontend reaches layers above "
                f"{limit} only through their public headers (include/meshmuon)"]
    return []


def header_homes() -> tuple[dict[str, set[Path]], list[str]]:
    """Where each public header is drawn (the sources that implement it) and the arrows that makes."""
    headers = {p.name: p.read_text() for p in (ROOT / "include" / "meshmuon").glob("*.h")}
    sources = {p: p.read_text(errors="replace") for p in cpp_files("src") if p.suffix in (".cpp", ".cu")}
    homes = {h: {Path(p) for p in s} for h, s in implementers(headers, sources).items()}
    problems = []
    for h, srcs in sorted(homes.items()):
        layer = HEADER_LAYER.get(h)
        if layer is None or not srcs:
            continue  # a header of no layer is reported above; no source: header-only, drawn in its layer
        name = f"include/meshmuon/{h} ({layer})"
        for s in sorted(srcs):
            theirs = layer_of_src(s)
            if theirs != layer:
                way = "back up" if LEVEL.get(theirs, 99) > LEVEL[layer] else "down"
                problems.append(f"{name} is implemented in {s.relative_to(ROOT)} ({theirs}): drawn there, an arrow "
                                f"{way} from what includes it; define it in src/{folder(layer)}/ or move it to {theirs}'s layer")
        if not any(s.stem == Path(h).stem and layer_of_src(s) == layer for s in srcs):
            have = ", ".join(str(s.relative_to(ROOT)) for s in sorted(srcs))
            problems.append(f"{name} is named after no source (implemented by {have}): name the source that "
                            f"implements it {Path(h).stem}.cpp, in src/{folder(layer)}/")
    return homes, problems


def draw(homes: dict[str, set[Path]]) -> list[str]:
    """The house, bottom floor first: each layer's folder and its public headers with their sources."""
    lines = []
    for name, headers in LAYERS:
        parts = []
        for h in headers:
            srcs = sorted(str(s.relative_to(ROOT / "src" / folder(name))) if layer_of_src(s) == name
                          else f"[{s.relative_to(ROOT)}: {layer_of_src(s)}]" for s in homes.get(h, ()))
            parts.append(f"{h} <- {' '.join(srcs)}" if srcs else f"{h} (header-only)")
        lines.append(f"  {name:<10} src/{folder(name)}/: " + ("; ".join(parts) if parts else "(internal)"))
    for front, limit in FRONTENDS.items():
        lines.append(f"  {'frontend':<10} {front}/: public headers; internal headers up to {limit}")
    return lines


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
    homes, arrows = header_homes()
    problems = cpp_violations() + arrows + python_violations()
    if "--graph" in sys.argv:
        print("layers, bottom first:", " < ".join(name for name, _ in LAYERS))
        print("\n".join(draw(homes)))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} violation(s) of the layer order", file=sys.stderr)
        return 1
    print(f"check_layers: ok ({' < '.join(name for name, _ in LAYERS)}; every public header drawn in its "
          "layer, named after a source; no include or import cycle)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
