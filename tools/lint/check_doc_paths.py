#!/usr/bin/env python3
"""Every repository path named in README.md and docs/**/*.md exists.

What counts as a path: a backticked span without spaces, or a markdown link target, that contains
a `/` (and either ends in a known extension, ends in `/`, or starts with a top-level folder of the
repository) or is a bare file name with a source extension (`.h`, `.cpp`, `.py`, ...). Fenced code
blocks are not read (they hold commands and output). Ignored: URLs, anchors, globs (`*`),
`<placeholders>`, `$VARIABLES`, paths on a machine (`/usr/...`, `/tmp/...`, `~/...`) and build
outputs (`build/`, `build-*/`, `dist/`, `demo-out/`, `shared/`, `python-stage/`).

Where a path is looked for: relative to the repository root, then to the document's folder; a
path with a `/` may also be the tail of a repository file (`comm/poll.h` as `#include` writes
src/comm/poll.h); a bare file name must be some file's name. `name.{h,cpp}` names both files; a
trailing `:123` (a line) is dropped.

Run: python3 tools/lint/check_doc_paths.py [--root DIR]   (make test runs it through
tests/python/test_doc_paths.py, with a planted wrong path as the negative control; exit 1 naming
each missing path with its file and line)
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Extensions that make a span a path even without a `/` (bare names are looked up by name).
SOURCE_EXT = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".py", ".sh", ".cmake", ".md", ".toml", ".map"}
# Extensions that make a span with a `/` a path whatever its first folder.
PATH_EXT = SOURCE_EXT | {".txt", ".json", ".yml", ".yaml", ".cfg", ".in", ".csv"}
# Outputs of a build or a run, and folders that live beside a checkout rather than in it.
OUTPUTS = ("build/", "build-", "dist/", "demo-out/", "shared/", "python-stage/", ".venv/", "out/")
SKIP_DIRS = {".git", "__pycache__", "node_modules"}
SKIP_TOP = {"dist", "demo-out", "shared", ".venv"}

# Headers of the libraries meshmuon builds against, named in the docs by their own names.
FOREIGN = {"mpi.h", "nccl.h", "cublas_v2.h", "cublasLt.h", "dnnl.h", "cblas.h", "lapacke.h"}

FENCE = re.compile(r"^\s*(```|~~~)")
BACKTICK = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PART = re.compile(r"^[A-Za-z0-9_.+\-{},]+$")


def repo_files(root: Path) -> tuple[set[str], set[str]]:
    """Every file (and folder) of the tree, relative to root, and every file name."""
    paths: set[str] = set()
    names: set[str] = set()
    for d, dirs, files in os.walk(root, followlinks=True):
        rel_dir = os.path.relpath(d, root)
        top = rel_dir == "."
        dirs[:] = [x for x in dirs
                   if x not in SKIP_DIRS and not (top and (x in SKIP_TOP or x.startswith("build")))]
        for x in dirs + files:
            rel = os.path.normpath(os.path.join(rel_dir, x))
            paths.add(rel)
            if x in files:
                names.add(x)
    return paths, names


def expand(path: str) -> list[str]:
    """`a/b.{h,cpp}` -> `a/b.h`, `a/b.cpp` (one brace group)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [path[: m.start()] + alt + path[m.end():] for alt in m.group(1).split(",")]


def candidate(text: str, top: set[str]) -> str | None:
    """The path a span or link names, or None when it is not a repository path."""
    t = text.strip().rstrip(".,;:")
    if not t or any(c.isspace() for c in t) or "://" in t or t.startswith(("mailto:", "#")):
        return None
    t = t.split("#", 1)[0]
    t = re.sub(r":\d+(-\d+)?$", "", t)
    if not t or any(c in t for c in "*<>$%=@") or t.startswith(("/", "~", "-", "..")) and not t.startswith("../"):
        return None
    if t.startswith(OUTPUTS) or "/build/" in t:
        return None
    parts = [p for p in t.split("/") if p]
    if not parts or not all(PART.match(p) for p in parts):
        return None
    ext = os.path.splitext(parts[-1])[1].split("}")[0]
    if "/" in t:
        if ext in PATH_EXT or t.endswith("/") or parts[0] in top or parts[0] == "..":
            return t
        return None
    return t if ext in SOURCE_EXT and not t.startswith(".") and t not in FOREIGN else None


def exists(path: str, doc_dir: str, paths: set[str], names: set[str]) -> bool:
    for p in expand(path):
        folder = p.endswith("/")
        p = p.rstrip("/")
        if "/" not in p and not folder:
            if p not in names:
                return False
            continue
        here = os.path.normpath(p)
        beside = os.path.normpath(os.path.join(doc_dir, p))
        if here in paths or beside in paths:
            continue
        if not p.startswith("../") and any(q.endswith("/" + here) for q in paths):
            continue
        return False
    return True


def docs(root: Path) -> list[Path]:
    out = [root / "README.md"] if (root / "README.md").exists() else []
    return out + sorted((root / "docs").rglob("*.md"))


def check(root: Path) -> list[str]:
    paths, names = repo_files(root)
    top = {p for p in paths if "/" not in p and (root / p).is_dir()}
    missing: list[str] = []
    for doc in docs(root):
        rel_doc = doc.relative_to(root).as_posix()
        doc_dir = os.path.dirname(rel_doc)
        fenced = False
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            spans = BACKTICK.findall(line) + LINK.findall(line)
            for s in spans:
                c = candidate(s, top)
                if c and not exists(c, doc_dir, paths, names):
                    missing.append(f"{rel_doc}:{n}: `{c}` names no file of the repository")
    return missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args()
    missing = check(args.root.resolve())
    for m in missing:
        print(m)
    if missing:
        print(f"check_doc_paths: {len(missing)} missing path(s)")
        return 1
    print(f"check_doc_paths: ok ({len(docs(args.root.resolve()))} documents)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
