# Where meshmuon.torch runs (meshmuon/torch/_device.py; its communicators: _comms.py) and tensors'
# devices across the binding.
# - Everywhere: the engine's device from the parameters (cpu, cuda:N, a clear TypeError for mixed
#   or unsupported devices, before anything is built), the device communicator's choice (c10d is
#   refused for CUDA parameters), the binding's DLPack device mapping (a CUDA array reaches the cpu
#   engine as a cuda view and is refused naming the parameter; managed memory is refused by the
#   binding; host-only functions refuse device arrays), and what a build or machine without CUDA
#   says when asked for the cuda backend.
# - On a GPU (skipped without one): meshmuon.torch.Muon on CUDA parameters, the local and the ZeRO
#   engines, against the same step on the CPU and against torch.optim.Muon on the GPU.
import ctypes
import socket
import subprocess
import sys
import types

import pytest
import torch

import meshmuon
import meshmuon.torch as dt
from meshmuon import _core
from meshmuon.torch import _comms, _device

CUDA = torch.cuda.is_available()


def fake(device: str):
    """A stand-in with only a `.device` (torch.device('cuda:1') needs no GPU to exist)."""
    return types.SimpleNamespace(device=torch.device(device))


def test_engine_device_from_the_parameters():
    assert _device.engine_device([torch.zeros(2, 2), torch.zeros(3)], ["a", "b"]) == "cpu"
    assert _device.engine_device([], []) == "cpu"
    assert _device.engine_device([fake("cuda:1"), fake("cuda:1")], ["a", "b"]) == "cuda:1"
    with pytest.raises(TypeError, match=r"parameter 'b' is on cuda:0 but 'a' is on cpu; one meshmuon "
                                        r"optimizer steps the parameters of one device"):
        _device.engine_device([torch.zeros(2), fake("cuda:0")], ["a", "b"])
    with pytest.raises(TypeError, match=r"parameter 'b' is on cuda:1 but 'a' is on cuda:0"):
        _device.engine_device([fake("cuda:0"), fake("cuda:1")], ["a", "b"])
    with pytest.raises(TypeError, match=r"parameter 'a' is on meta; meshmuon steps CPU and CUDA tensors"):
        _device.engine_device([torch.zeros(2, device="meta")], ["a"])
    assert _device.default_machine("cpu") == "cpu" and _device.default_machine("cuda:0") == "h100"


def test_muon_refuses_an_unsupported_device_before_building():
    w = torch.nn.Parameter(torch.zeros(4, 4, device="meta"))
    with pytest.raises(TypeError, match=r"parameter 0 is on meta; meshmuon steps CPU and CUDA tensors"):
        dt.Muon([w], lr=0.02)


def test_process_group_backend_follows_the_machine(monkeypatch):
    assert _comms.pg_backend("gloo") == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _comms.pg_backend() == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    assert _comms.pg_backend() == "cpu:gloo,cuda:nccl"
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    assert _comms.pg_backend() == "gloo"


def test_device_communicator_choice(monkeypatch):
    monkeypatch.delenv("MESHMUON_COMM", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    assert _comms.device_comm_kind() == "nccl"
    assert _comms.device_comm_kind("nccl") == "nccl"
    with pytest.raises(ValueError, match=r"c10d communicator \(MESHMUON_COMM=c10d\) carries host buffers"):
        _comms.device_comm_kind("c10d")
    with pytest.raises(ValueError, match=r"communicator 'gloo' \(MESHMUON_COMM\) is unknown"):
        _comms.device_comm_kind("gloo")
    with pytest.raises(RuntimeError, match=r"needs a job launched with mpirun"):
        _comms.device_comm_kind("mpi")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert _comms.device_comm_kind() == "mpi"
    # one rank on the CPU: the host single communicator
    assert _comms.communicator(1, "cpu").size == 1


_WRAP = r'''
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from meshmuon.torch._layout import dtensor as _layouts
mesh = DeviceMesh("cuda", [0], _init_backend=False)  # a cuda mesh (no GPU needed to describe one)
local = torch.arange(6.).reshape(2, 3)
d = _layouts.wrap_local(local, mesh, [Shard(0)], [2, 3], (3, 1))
assert d._local_tensor.data_ptr() == local.data_ptr() and d._local_tensor.device.type == "cpu"
assert d.device_mesh.device_type == "cuda" and d.shape == (2, 3) and d.placements == (Shard(0),)
e = _layouts.wrap_local(local, DeviceMesh("cpu", [0]), [Replicate()], [2, 3], (3, 1))
assert e._local_tensor.data_ptr() == local.data_ptr()
# negative control: from_local moves CPU memory to the cuda mesh's device (or, without CUDA, fails)
try:
    moved = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    aliased = moved._local_tensor.data_ptr() == local.data_ptr()
except (AssertionError, RuntimeError):
    aliased = False
assert not aliased
dist.destroy_process_group()
print("WRAP OK")
'''


def test_cpu_state_on_a_cuda_mesh_is_wrapped_not_moved():
    # FSDP2's CPUOffloadPolicy shards and offload_state's home copies are CPU memory on a cuda
    # mesh: their state DTensors must alias the engine's memory (from_local would move them)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-c", _WRAP, str(port)], capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert proc.returncode == 0 and "WRAP OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.skipif(CUDA, reason="checks the no-device path")
def test_cuda_without_a_device_is_a_clear_error():
    for make in (lambda: _core.make_single_communicator("cuda:0"),
                 lambda: _comms.communicator(1, "cuda:0")):
        with pytest.raises(_core.MeshmuonError, match=r"\[comm\] make_single_communicator\('cuda:0'\): no "
                                                   r"usable CUDA device"):
            make()
    info = _core.ParamInfo()
    info.name, info.shape = "w", [4, 4]
    group = _core.ParamGroup()
    group.params = [0]
    with pytest.raises(_core.MeshmuonError, match=r"\[cuda\]"):
        meshmuon.LocalOptimizer([info], [group], device="cuda")


def test_bad_device_names():
    with pytest.raises(ValueError, match=r"device must be cpu, cuda or cuda:N \(got 'cuda:x'\)"):
        _core.make_single_communicator("cuda:x")
    info = _core.ParamInfo()
    info.name, info.shape = "w", [4, 4]
    group = _core.ParamGroup()
    group.params = [0]
    with pytest.raises(ValueError, match=r"option 'device' must be cpu, cuda or cuda:N \(got 'tpu'\)"):
        meshmuon.LocalOptimizer([info], [group], device="tpu")


def test_communicators_say_whether_they_carry_device_memory():
    assert _core.make_single_communicator().device_buffers is False
    assert _core.make_single_communicator("cpu").device_buffers is False
    if CUDA:
        assert _core.make_single_communicator("cuda:0").device_buffers is True


@pytest.mark.skipif(not CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")
def test_a_cuda_engine_refuses_a_host_only_communicator():
    inv = _core.Inventory()
    inv.model = "t"
    inv.meshes, inv.mesh_names = [_core.Mesh([])], ["dense"]
    spec = _core.ParamSpec()
    spec.name, spec.shape = "w", [4, 6]
    inv.params = [spec]
    group = _core.ParamGroup()
    group.params = [0]
    with pytest.raises(ValueError, match=r"communicator 'world' \(backend 'single'\) carries host "
                                         r"memory only"):
        _core.Optimizer(_core.make_single_communicator("cpu"), inv, [group], device="cuda:0")
    _core.Optimizer(_core.make_single_communicator("cuda:0"), inv, [group], device="cuda:0")


# ---- DLPack devices across the binding, with hand-made DLPack capsules -------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_KEEP: list = []  # the capsules' memory (host memory: nothing may read it, it is never freed early)


def dlpack_array(shape, device_type: int, device_id: int):
    """A legacy DLPack capsule of an fp32 array that claims to live on (device_type, device_id),
    backed by host memory: what the binding sees of a CUDA tensor, made without a GPU."""
    n = 1
    for s in shape:
        n *= s
    storage = (ctypes.c_float * max(n, 1))()
    dims = (ctypes.c_int64 * len(shape))(*shape)
    mt = _DLManagedTensor()
    mt.dl_tensor.data = ctypes.addressof(storage)
    mt.dl_tensor.device = _DLDevice(device_type, device_id)
    mt.dl_tensor.ndim = len(shape)
    mt.dl_tensor.dtype = _DLDataType(2, 32, 1)  # kDLFloat, 32 bits
    mt.dl_tensor.shape = dims
    mt.dl_tensor.strides = None
    _KEEP.extend([storage, dims, mt])
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(mt), b"dltensor", None)


def _local_optimizer():
    info = _core.ParamInfo()
    info.name, info.shape = "w", [4, 4]
    group = _core.ParamGroup()
    group.params = [0]
    return meshmuon.LocalOptimizer([info], [group])


def test_a_cuda_array_reaches_the_engine_as_a_device_view():
    # kDLCUDA on device 1: the cpu engine refuses it naming the parameter and both devices, so the
    # binding carried the device through (negative control: a CPU array of the same shape steps)
    opt = _local_optimizer()
    with pytest.raises(ValueError, match=r"parameter 'w' is on cuda:1"):
        opt.step([dlpack_array([4, 4], 2, 1)], [torch.ones(4, 4)])
    w = torch.zeros(4, 4)
    assert opt.step([w], [torch.ones(4, 4)])
    assert w.abs().sum() > 0
    with pytest.raises(ValueError, match=r"gradient of 'w' is on cuda:0"):
        opt.step([w], [dlpack_array([4, 4], 2, 0)])


def test_pinned_host_arrays_are_cpu_and_other_devices_are_refused():
    opt = _local_optimizer()
    # kDLCUDAHost (pinned host memory) is CPU memory: it steps
    assert opt.step([dlpack_array([4, 4], 3, 0)], [torch.ones(4, 4)])
    with pytest.raises(ValueError, match=r"parameter: DLPack device type 13 \(device 0\) is not "
                                         r"supported; meshmuon takes CPU and CUDA tensors"):
        opt.step([dlpack_array([4, 4], 13, 0)], [torch.ones(4, 4)])


def test_host_only_functions_refuse_device_arrays():
    o = meshmuon.Orthogonalizer(meshmuon.NsOptions())
    with pytest.raises(ValueError, match=r"in is on cuda:0; this function runs on the CPU"):
        o.run(dlpack_array([4, 4], 2, 0), torch.zeros(4, 4))


# ---- on a GPU ----------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")


def _model_params(device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (96, 64), (32, 96), (64,)]
    return [torch.nn.Parameter((torch.randn(s, generator=g) * 0.02).to(device=device, dtype=dtype))
            for s in shapes]


def _grads(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g).to(device=p.device, dtype=p.dtype) for p in params]


def _muon(params, **kw):
    return dt.Muon([dict(params=params[:3]), dict(params=params[3:], algorithm="adamw")], lr=0.02,
                   **kw)


@gpu
@pytest.mark.parametrize("kw,bound", [(dict(), 0.02), (dict(ns_matmul_dtype="fp32"), 1e-3),
                                      (dict(offload_state=True), 0.02)])
def test_cuda_step_matches_the_cpu_step(kw, bound):
    cpu, cuda = _model_params("cpu"), _model_params("cuda")
    init = _model_params("cpu")
    opts = [_muon(cpu, **kw), _muon(cuda, **kw)]
    for step in range(3):
        for ps, opt in zip((cpu, cuda), opts):
            for p, g in zip(ps, _grads(ps, seed=step)):
                p.grad = g
            opt.step()
    assert opts[1].engine == "local"
    for a, b, p0 in zip(cpu, cuda, init):
        assert b.is_cuda
        da, db = a.detach() - p0, b.detach().cpu() - p0
        if a.ndim == 2:  # Newton-Schulz: cuBLAS and the CPU's products round differently
            assert ((db - da).norm() / da.norm()).item() < bound
        else:  # AdamW: element-wise kernels with the CPU's arithmetic
            assert torch.allclose(da, db, rtol=0, atol=1e-6), (da - db).abs().max()
    state = opts[1].state[cuda[0]]
    assert state["momentum_buffer"].is_cuda == (not kw.get("offload_state", False))


@gpu
def test_cuda_step_agrees_with_torch_optim_muon():
    ps, ref = _model_params("cuda")[:3], _model_params("cuda")[:3]
    opt = dt.Muon(ps, lr=0.02)
    base = torch.optim.Muon(ref, lr=0.02)
    for p, q, g in zip(ps, ref, _grads(ps)):
        p.grad, q.grad = g, g.clone()
    opt.step()
    base.step()
    init = _model_params("cuda")[:3]
    for p, q, p0 in zip(ps, ref, init):
        d, e = (p - p0).detach(), (q - p0).detach()
        assert ((d - e).norm() / e.norm()).item() < 0.05  # bf16 products on both sides


@gpu
def test_bf16_cuda_parameters_use_fp32_masters_on_the_device():
    ps = _model_params("cuda", dtype=torch.bfloat16)
    opt = _muon(ps)
    for p, g in zip(ps, _grads(ps)):
        p.grad = g
    opt.step()
    assert opt.state[ps[0]]["master"].is_cuda and opt.state[ps[0]]["master"].dtype == torch.float32
    assert torch.equal(ps[0].detach(), opt.state[ps[0]]["master"].to(torch.bfloat16))


@gpu
def test_zero_on_one_cuda_rank_matches_the_local_engine():
    a, b = _model_params("cuda"), _model_params("cuda")
    opts = [_muon(a), _muon(b, zero=True)]
    for ps, opt in zip((a, b), opts):
        for p, g in zip(ps, _grads(ps)):
            p.grad = g
        opt.step()
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())


def test_the_callers_stream_is_for_device_engines_only():
    """Steps order themselves with the caller's CUDA stream (set_stream); the CPU has none."""
    assert _device.caller_stream("cpu") is None
    info = meshmuon.ParamInfo()
    info.name, info.shape = "w", [4, 4]
    group = meshmuon.ParamGroup()
    group.params = [0]
    opt = meshmuon.LocalOptimizer([info], [group])
    assert opt.stream() is None
    opt.set_stream(None)
    with pytest.raises(ValueError, match="set_stream: the optimizer runs on cpu, which has no device streams"):
        opt.set_stream(1)
    assert opt.stream() is None


@gpu
def test_cuda_step_on_a_side_stream_is_ordered_with_it():
    """Gradients written on a side stream and the step run under it, nothing synchronized by hand:
    the engine takes that stream (set_stream) and the parameters read there after the step equal a
    run on the default stream."""
    side = torch.cuda.Stream()
    ref, ps = _model_params("cuda"), _model_params("cuda")
    opt_ref, opt = _muon(ref), _muon(ps)
    for step in range(2):
        for p, g in zip(ref, _grads(ref, seed=step)):
            p.grad = g
        opt_ref.step()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for p, g in zip(ps, _grads(ps, seed=step)):
                p.grad = g
            opt.step()
            assert opt._engine.core.stream() == side.cuda_stream
            got = [p.detach().clone() for p in ps]
        torch.cuda.current_stream().wait_stream(side)
        for a, b in zip(ref, got):
            assert torch.equal(a.detach(), b)
