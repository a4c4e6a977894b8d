"""The layer order of src/ and python/meshmuon (scripts/check_layers.py): the tree keeps it, and the
check sees a violation when there is one (negative controls on a copy of the tree)."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)


def copy_tree(tmp_path: Path) -> Path:
    for d in ("src", "include", "python/meshmuon"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return tmp_path


def test_the_tree_keeps_the_layer_order():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check_layers: ok" in r.stdout


def test_an_include_up_a_layer_is_found(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "core" / "error.cpp"
    f.write_text('#include "exec/optimizer_impl.h"\n' + f.read_text())
    r = run(root)
    assert r.returncode == 1
    assert "src/core/error.cpp (core) includes exec/optimizer_impl.h (exec): a layer above it" in r.stdout


def test_a_private_backend_header_included_from_outside_is_found(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "comm" / "nccl" / "nccl_args.h"
    f.write_text(f.read_text() + '\n#include "backend/cuda/cuda_backend.h"\n')
    r = run(root)
    assert r.returncode == 1
    assert ("src/comm/nccl/nccl_args.h includes backend/cuda/cuda_backend.h: a private header of src/backend/cuda/"
            in r.stdout), r.stdout


def test_an_include_cycle_is_found(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "src" / "exec" / "param_table.h"
    f.write_text(f.read_text() + '\n#include "exec/step_inputs.h"\n')
    r = run(root)
    assert r.returncode == 1
    assert "include cycle:" in r.stdout and "src/exec/param_table.h" in r.stdout


def test_an_import_cycle_is_found(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "python" / "meshmuon" / "torch" / "_layouts.py"
    f.write_text(f.read_text() + "\nfrom . import _zero  # noqa\n")
    r = run(root)
    assert r.returncode == 1
    assert "import cycle:" in r.stdout and "meshmuon.torch._layouts" in r.stdout
