# The native module: BLAS at full speed without settings, error translation, zero-copy views, CLI.
import os
import shutil
import subprocess
import sys

import pytest
import torch

import meshmuon


def test_blas_core_ok_after_torch_and_numpy_in_a_fresh_interpreter():
    code = ("import torch, numpy, meshmuon; i = meshmuon.blas_info(); "
            "print(i['core_ok'], i['corename'], i['recommended'])")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "True", out
    if out[2:]:  # a recommendation exists on this CPU: the loaded core must be that one
        assert out[1].lower() == out[2].lower(), out


def test_blas_core_check_can_fail():
    # Negative control: forcing a generic core is reported as not ok on a CPU with a recommendation.
    code = "import meshmuon; i = meshmuon.blas_info(); print(i['core_ok'], i['recommended'] or '-')"
    env = dict(os.environ, OPENBLAS_CORETYPE="Prescott")
    ok, recommended = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                     text=True, check=True).stdout.split()
    if recommended == "-":
        pytest.skip("this CPU has no recommended OpenBLAS core")
    assert ok == "False"


def test_errors_cross_as_python_exceptions_with_messages():
    assert issubclass(meshmuon.MeshmuonError, RuntimeError)
    ns = meshmuon.NsOptions()
    with pytest.raises(ValueError, match=r"\[orth\] unknown schedule 'bogus'"):
        ns.schedule = "bogus"
    g = meshmuon.GroupOptions()
    g.momentum = -0.5
    with pytest.raises(ValueError, match=r"momentum -0.5 must be finite and >= 0"):
        g.validate(3)
    info = meshmuon.ParamInfo()
    info.name, info.shape = "w", [4, 4]
    group = meshmuon.ParamGroup()
    group.params = [0]
    opt = meshmuon.LocalOptimizer([info], [group])
    p, grad = torch.zeros(4, 4), torch.full((4, 4), float("nan"))
    with pytest.raises(meshmuon.MeshmuonError, match="gradient of parameter 'w' is not finite"):
        opt.step([p], [grad])


def test_orthogonalizer_is_zero_copy_in_place_and_releases_nothing_else():
    x = torch.randn(16, 40)
    ptr = x.data_ptr()
    before = x.clone()
    meshmuon.Orthogonalizer(meshmuon.NsOptions()).run(x, x)
    assert x.data_ptr() == ptr and not torch.equal(x, before)
    s = torch.linalg.svdvals(x)
    assert 0.5 < s.min() and s.max() < 1.3  # Jordan schedule's band
    with pytest.raises(ValueError, match="fp32"):
        y = torch.randn(4, 4).bfloat16()
        meshmuon.Orthogonalizer(meshmuon.NsOptions()).run(y, y)


def test_state_tensors_alias_engine_memory():
    info = meshmuon.ParamInfo()
    info.name, info.shape = "w", [3, 5]
    group = meshmuon.ParamGroup()
    group.params = [0]
    opt = meshmuon.LocalOptimizer([info], [group])
    a, b = opt.state(0, "momentum_buffer"), opt.state(0, "momentum_buffer")
    assert isinstance(a, torch.Tensor) and a.shape == (3, 5) and a.data_ptr() == b.data_ptr()
    a.fill_(2.0)
    assert torch.all(b == 2.0)
    del opt  # the tensors keep the engine alive
    assert torch.all(a == 2.0)


def test_cli_console_script_runs_the_native_binary():
    exe = shutil.which("meshmuon")
    assert exe is not None, "the `meshmuon` console script is not on PATH"
    out = subprocess.run([exe, "info"], capture_output=True, text=True, check=True).stdout
    assert "meshmuon" in out.lower()
    native = os.path.join(os.path.dirname(meshmuon.__file__), "bin", "meshmuon")
    assert os.access(native, os.X_OK)


def test_gil_is_released_during_a_step():
    import threading

    import meshmuon.torch as dt

    w = torch.nn.Parameter(torch.randn(768, 768))
    w.grad = torch.randn(768, 768)
    opt = dt.Muon([w], ns_method="plain", ns_steps=20)
    opt.step()  # warm up (BLAS load, buffers)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (opt.step(), done.set()))
    spins = 0
    worker.start()
    while not done.is_set():
        spins += 1  # only runs while the native step does not hold the GIL
    worker.join()
    # A step holding the GIL would leave this thread a handful of switch intervals at most.
    assert spins > 20_000, spins
