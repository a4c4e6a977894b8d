"""Every repository path named in README.md and docs/ exists (tools/lint/check_doc_paths.py): the tree
keeps it, and the check names a planted wrong path with its file and line (the negative control,
on a copy of the docs beside links to the rest of the tree). Run: python -m pytest
tests/python/test_doc_paths.py -q (make test runs it with the Python suite)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "lint" / "check_doc_paths.py"


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)


def copy_docs(tmp_path: Path) -> Path:
    """README.md and docs/ copied (so they can be edited), every other top-level entry linked."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for entry in ROOT.iterdir():
        if entry.name not in ("docs", "README.md", ".git") and not entry.name.startswith("build"):
            os.symlink(entry, tmp_path / entry.name)
    return tmp_path


def test_every_path_the_docs_name_exists():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check_doc_paths: ok" in r.stdout


def test_the_copy_passes_before_anything_is_planted(tmp_path):
    r = run(copy_docs(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_planted_wrong_path_is_named_with_its_file_and_line(tmp_path):
    root = copy_docs(tmp_path)
    doc = root / "docs" / "architecture.md"
    lines = doc.read_text().splitlines()
    lines.insert(2, "The pipeline's passes are in `src/exec/pipline.cpp`.")
    doc.write_text("\n".join(lines) + "\n")
    r = run(root)
    assert r.returncode == 1, r.stdout
    assert "docs/architecture.md:3: `src/exec/pipline.cpp` names no file of the repository" in r.stdout


def test_a_moved_header_named_in_a_link_is_found(tmp_path):
    root = copy_docs(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\nSee [the memory spaces](src/comm/memory_space.h).\n")
    r = run(root)
    assert r.returncode == 1, r.stdout
    n = len(readme.read_text().splitlines())
    assert f"README.md:{n}: `src/comm/memory_space.h` names no file of the repository" in r.stdout


def test_urls_globs_placeholders_and_build_outputs_are_not_paths(tmp_path):
    root = copy_docs(tmp_path)
    doc = root / "docs" / "architecture.md"
    doc.write_text(doc.read_text() + "\n`https://example.org/a.md` `tests/*/x.cpp` `src/backend/<name>/`"
                   " `build/bin/meshmuon` `dist/cu13/` `/usr/include/mpi.h` `/tmp/x.py` `GFLOP/s`\n")
    r = run(root)
    assert r.returncode == 0, r.stdout
