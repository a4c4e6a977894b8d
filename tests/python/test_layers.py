"""The layer order of src/, the public headers' homes, the frontends (python/src, tools/cli) and
python/meshmuon (tools/lint/check_layers.py): the tree keeps it, and the check sees a violation when
there is one (negative controls on a copy of the tree, one per rule)."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "lint" / "check_layers.py"


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)


def copy_tree(tmp_path: Path) -> Path:
    for d in ("src", "include", "python/meshmuon", "python/src", "tools"):
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
    f = root / "python" / "meshmuon" / "torch" / "_layout" / "dtensor.py"
    f.write_text(f.read_text() + "\nfrom .. import _zero  # noqa\n")
    r = run(root)
    assert r.returncode == 1
    assert "import cycle:" in r.stdout and "meshmuon.torch._layout.dtensor" in r.stdout


def test_the_graph_draws_each_public_header_with_its_sources():
    r = subprocess.run([sys.executable, str(SCRIPT), "--graph"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "device.h <- device.cpp" in r.stdout and "comm.h <- comm.cpp" in r.stdout
    assert "qk_clip.h <- qk_clip.cpp" in r.stdout and "export.h (header-only)" in r.stdout


def test_a_header_implemented_in_a_layer_above_is_found(tmp_path):
    root = copy_tree(tmp_path)
    (root / "src" / "exec" / "planted.cpp").write_text(
        '#include "meshmuon/qk_clip.h"\nnamespace meshmuon {\n'
        "double qk_clip_gamma(double max_logit, double threshold) { return threshold / max_logit; }\n}\n")
    r = run(root)
    assert r.returncode == 1
    assert ("include/meshmuon/qk_clip.h (kernels) is implemented in src/exec/planted.cpp (exec): "
            "drawn there, an arrow back up") in r.stdout


def test_a_header_named_after_no_source_is_found(tmp_path):
    root = copy_tree(tmp_path)
    cpu = root / "src" / "backend" / "cpu" / "kernels"
    (cpu / "qk_clip.cpp").rename(cpu / "clip.cpp")
    r = run(root)
    assert r.returncode == 1
    assert ("include/meshmuon/qk_clip.h (kernels) is named after no source "
            "(implemented by src/backend/cpu/kernels/clip.cpp)") in r.stdout


def test_the_nanobind_module_reaching_into_the_engine_is_found(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "python" / "src" / "module.cpp"
    f.write_text('#include "exec/optimizer_impl.h"\n' + f.read_text())
    r = run(root)
    assert r.returncode == 1
    assert ("python/src/module.cpp (python/src) includes exec/optimizer_impl.h, an internal header of exec: "
            "a frontend reaches layers above kernels only through their public headers") in r.stdout


def test_the_cli_reaching_into_the_engine_is_found(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "tools" / "cli" / "main.cpp"
    f.write_text('#include "state/state_store.h"\n' + f.read_text())
    r = run(root)
    assert r.returncode == 1
    assert ("tools/cli/main.cpp (tools/cli) includes state/state_store.h, an internal header of state: "
            "a frontend reaches layers above comm only through their public headers") in r.stdout


def test_one_frontend_including_another_is_found(tmp_path):
    root = copy_tree(tmp_path)
    f = root / "tools" / "cli" / "main.cpp"
    f.write_text('#include "../../python/src/bindings.h"\n' + f.read_text())
    r = run(root)
    assert r.returncode == 1
    assert "tools/cli/main.cpp (tools/cli) includes ../../python/src/bindings.h of the frontend python/src" in r.stdout
