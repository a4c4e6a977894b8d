# The options a training script needs on meshmuon.torch.Muon (issue 13): the distributed engine's
# options (window, chunk_bytes, strategy pins per parameter and per group, replica, machine,
# timeout_s, allow_inexact) checked up front and passed through, `opt.plan()`, `none_grad`,
# Motif-style `clip_config`, profiler ranges, `last_step_stats` on both engines, and the bf16
# product-precision report and warning. Multi-rank behaviour: tests/python/multirank/test_options_mpi.py.
import copy
import json
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import meshmuon
import meshmuon.torch as dt
from meshmuon.torch import _precision


class Attn(nn.Module):
    def __init__(self, d=32, heads=4, kv_heads=2):
        super().__init__()
        hd = d // heads
        self.q_proj = nn.Linear(d, heads * hd, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 32)
        self.layers = nn.ModuleList([Attn(), Attn()])
        self.norm = nn.LayerNorm(32)
        self.fc = nn.Linear(32, 48)


def set_grads(model, step=0):
    g = torch.Generator().manual_seed(100 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def run(model, steps=2, logits=None, **kw):
    opt = dt.Muon(dt.param_groups(model), lr=0.05, **kw)
    for s in range(steps):
        set_grads(model, s)
        opt.step(qk_logits=logits)
    return opt


# ---- distributed-engine options: checked up front, named in the error --------------------------

@pytest.mark.parametrize("kw,needle", [
    (dict(window=0), "window=0"), (dict(window=1.5), "window=1.5"), (dict(window=True), "window=True"),
    (dict(chunk_bytes=0), "chunk_bytes=0"), (dict(chunk_bytes="32M"), "chunk_bytes='32M'"),
    (dict(replica="dup"), "replica='dup'.*'auto', 'duplicate', 'split'"),
    (dict(timeout_s=-1), "timeout_s=-1"), (dict(timeout_s=float("inf")), "timeout_s=inf"),
    (dict(machine="a100"), "machine='a100'.*'h100', 'h200', 'h100-ib', 'h200-ib', 'cpu'"),
    (dict(machine={"bandwidth": 1e9}), "machine=.*unknown field 'bandwidth'"),
    (dict(machine="/nonexistent/profile.json"), "machine=.*cannot read"),
    (dict(strategy="*.fc.*:no_such"), "strategy=.*no_such"),
    (dict(strategy={"*.fc.*": "no_such"}), "strategy: strategy 'no_such' for '\\*.fc.\\*'"),
    (dict(strategy={"default": "fast"}), "strategy\\['default'\\]='fast'"),
    (dict(strategy={"a:b": "local"}), "pattern 'a:b'"),
    (dict(allow_inexact="yes"), "allow_inexact='yes'"),
    (dict(none_grad=1), "none_grad=1"),
])
@pytest.mark.parametrize("engine", [None, "distributed"])
def test_bad_values_raise_naming_the_option(kw, needle, engine):
    model = Net()
    before = params_of(model)
    with pytest.raises(ValueError, match=needle):
        dt.Muon(dt.param_groups(model), engine=engine, **kw)
    assert same(before, params_of(model))


def test_strategy_type_and_group_key_errors():
    with pytest.raises(TypeError, match="strategy must be"):
        dt.Muon(dt.param_groups(Net()), strategy=["local"])
    with pytest.raises(ValueError, match="param group 0: strategy='nope'"):
        dt.Muon(dt.param_groups(Net(), muon=dict(strategy="nope")))
    # a key of Muon groups only: in an AdamW group it is the other algorithm's key
    with pytest.raises(ValueError, match="belong to the other algorithm"):
        dt.Muon(dt.param_groups(Net(), adamw=dict(strategy="local")))
    with pytest.raises(ValueError, match="'pin' \\(use strategy\\)"):
        dt.Muon([dict(params=[nn.Parameter(torch.zeros(3, 3))], pin="local")])


def test_local_engine_accepts_and_ignores_the_distributed_options(tmp_path):
    profile = tmp_path / "machine.json"
    profile.write_text(json.dumps({"bandwidth_Bps": 1e9, "flops_per_s": 1e12}))
    m0 = Net()
    ref_model, opt_model = copy.deepcopy(m0), copy.deepcopy(m0)
    ref = run(ref_model)
    opt = run(opt_model, window=4, chunk_bytes=1024, strategy={"*.o_proj.*": "owner_a2a",
                                                                "default": "allgather"},
              replica="split", machine=str(profile), timeout_s=5.0, allow_inexact=True)
    assert opt.engine == "local"
    assert same(params_of(ref_model), params_of(opt_model))  # bitwise: ignored
    assert opt.plan().to_json() == ref.plan().to_json()      # the one-rank plan is the engine's own
    assert set(opt.plan().strategies.values()) == {"local"}


# ---- the plan ------------------------------------------------------------------------------------

def test_plan_object_prints_like_meshmuon_plan_and_gives_json():
    model = Net()
    opt = dt.Muon(dt.param_groups(model))
    plan = opt.plan()
    text = str(plan)
    assert text.startswith("meshmuon plan:") and "strategy" in text and "total" in text
    assert json.loads(plan.to_json()) == plan.json
    muon_names = {n for n, p in model.named_parameters() if dt.classify(model)[n] == "muon"}
    assert set(plan.strategies) == muon_names and "embed.weight" not in plan.strategies
    assert plan.world_size == 1 and plan.engine == "local"
    assert plan.bytes_sent_max == 0 and plan.bytes_recv_max == 0
    assert set(plan.decisions.values()) <= {"cost", "pin", "fallback", "env"}
    assert "local engine" in repr(plan)


def test_chunk_bytes_window_and_machine_change_the_distributed_plan(tmp_path):
    # engine="distributed" in one process: the distributed core on one rank
    base = dt.Muon(dt.param_groups(Net()), engine="distributed").plan()
    small = dt.Muon(dt.param_groups(Net()), engine="distributed", chunk_bytes=4096, window=3).plan()
    assert base.num_chunks == 1 and base.options["chunk_bytes"] == 32 << 20
    assert small.num_chunks > base.num_chunks and small.options["chunk_bytes"] == 4096
    assert small.options["window"] == 3 and base.options["window"] == 2
    assert base.options["machine"]["name"] == "cpu"  # the default: the step runs on the CPU
    assert dt.Muon(dt.param_groups(Net()), engine="distributed",
                   machine="h100").plan().options["machine"]["name"] == "h100"
    custom = dt.Muon(dt.param_groups(Net()), engine="distributed",
                     machine={"name": "mine", "flops_per_s": 1e12}).plan().options["machine"]
    assert custom["name"] == "mine" and custom["flops_per_s"] == 1e12
    profile = tmp_path / "m.json"
    profile.write_text(json.dumps({"latency_s": 1e-3}))
    assert dt.Muon(dt.param_groups(Net()), engine="distributed",
                   machine=profile).plan().options["machine"]["latency_s"] == 1e-3
    assert dt.Muon(dt.param_groups(Net()), engine="distributed",
                   allow_inexact=True).plan().options["exact"] is False
    profile_obj = meshmuon.MachineProfile.from_json('{"name": "obj", "latency_s": 2e-3}')
    assert dt.Muon(dt.param_groups(Net()), engine="distributed",
                   machine=profile_obj).plan().options["machine"]["name"] == "obj"
    with pytest.raises(TypeError, match="machine must be"):
        dt.Muon(dt.param_groups(Net()), machine=3)


def test_pins_per_parameter_and_per_group_reach_the_planner():
    # On one rank only `local` can run a matrix, so the pins show in the decisions ("pin" instead of
    # "cost"); tests/python/multirank/test_options_mpi.py checks pins that change strategies.
    model = Net()
    plan = dt.Muon(dt.param_groups(model), engine="distributed",
                   strategy={"layers.0.*": "local"}).plan()
    assert {n: d for n, d in plan.decisions.items() if d == "pin"} == \
        {"layers.0.q_proj.weight": "pin", "layers.0.k_proj.weight": "pin", "layers.0.o_proj.weight": "pin"}
    def groups():
        return [dict(params=[("fc.weight", model.fc.weight)], strategy="local"),
                dict(params=[("o", model.layers[0].o_proj.weight)])]
    opt = dt.Muon(groups(), engine="distributed", strategy="default:local")
    assert opt.plan().decisions == {"fc.weight": "pin", "o": "pin"}
    plan = dt.Muon(groups(), engine="distributed").plan()
    assert plan.decisions == {"fc.weight": "pin", "o": "cost"}  # negative control: group key only
    # a pin that cannot run a parameter is refused at construction, naming it
    with pytest.raises(ValueError, match="parameter 'fc.weight'.*owner_a2a"):
        dt.Muon(dt.param_groups(model), engine="distributed", strategy={"fc.weight": "owner_a2a"})


def test_group_dicts_can_build_a_second_optimizer():
    # torch adds `param_names` to a group of named parameters; like torch's optimizers, meshmuon
    # accepts the same group dicts again (it used to call param_names an unknown key)
    w = nn.Parameter(torch.randn(6, 4))
    groups = [dict(params=[("w", w)], strategy="local")]
    dt.Muon(groups)
    assert groups[0]["param_names"] == ["w"]
    opt = dt.Muon(groups, engine="distributed")
    assert opt.plan().decisions == {"w": "pin"}
    with pytest.raises(ValueError, match="unknown keys 'param_name'"):  # negative control
        dt.Muon([dict(params=[w], param_name=["w"])])


def test_group_strategy_is_fixed_at_construction():
    model = Net()
    opt = dt.Muon(dt.param_groups(model, muon=dict(strategy="local")))
    set_grads(model)
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    opt.param_groups[0]["strategy"] = None
    before = params_of(model)
    with pytest.raises(ValueError, match="param group 0: strategy changed after construction"):
        opt.step()
    assert same(before, params_of(model))
    opt.param_groups[0]["strategy"] = "local"
    opt.step()
    # a checkpoint saved with another strategy loads (strategies do not shape the state): the plan
    # and the group's key stay this optimizer's
    state["param_groups"][0]["strategy"] = None
    opt.load_state_dict(state)
    assert opt.param_groups[0]["strategy"] == "local"
    opt.step()


# ---- none_grad -----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine", [None, "distributed"])
def test_none_grad_frees_consumed_gradients(engine):
    m0 = Net()
    a, b = copy.deepcopy(m0), copy.deepcopy(m0)
    keep = dt.Muon(dt.param_groups(a), lr=0.05, engine=engine)
    free = dt.Muon(dt.param_groups(b), lr=0.05, engine=engine, none_grad=True)
    for s in range(2):
        set_grads(a, s)
        set_grads(b, s)
        b.fc.bias.grad = a.fc.bias.grad = None  # a parameter without gradient stays as it is
        keep.step()
        free.step()
        assert all(p.grad is not None for n, p in a.named_parameters() if n != "fc.bias")  # default
        assert all(p.grad is None for p in b.parameters())
    assert same(params_of(a), params_of(b))  # the same results


def test_none_grad_keeps_gradients_when_the_step_raises():
    model = Net()
    opt = dt.Muon(dt.param_groups(model), none_grad=True)
    set_grads(model)
    model.fc.weight.grad[0, 0] = float("nan")
    with pytest.raises(meshmuon.MeshmuonError):
        opt.step()
    assert all(p.grad is not None for p in model.parameters())


# ---- clip_config (Motif-style QK-clip by names) ----------------------------------------------------

LOGITS = {0: [120.0, 30.0, 250.0, 90.0], 1: [101.0, 400.0, 10.0, 99.0]}


def test_clip_config_equals_the_explicit_qk_layout_bitwise():
    m0 = Net()
    runs = {}
    layout = {}
    for i in range(2):
        layout[f"layers.{i}.q_proj.weight"] = dict(layer=i, kind="q", heads=4, head_dim=8)
        layout[f"layers.{i}.k_proj.weight"] = dict(layer=i, kind="k", heads=2, head_dim=8)
    configs = {
        "layout": dict(qk_layout=layout, qk_clip_threshold=100.0),
        "clip": dict(clip_config=dict(q_proj="*.q_proj.weight", k_proj=["layers.*.k_proj.weight"],
                                      head_dim=8, threshold=100.0)),
        "none": dict(),
    }
    for name, kw in configs.items():
        m = copy.deepcopy(m0)
        run(m, logits=LOGITS if name != "none" else None, **kw)
        runs[name] = params_of(m)
    assert same(runs["layout"], runs["clip"])
    assert not same(runs["layout"], runs["none"])  # negative control: the clip acted


def test_clip_config_heads_clip_only_the_named_query_heads():
    m0 = Net()
    layout = {f"layers.{i}.q_proj.weight": dict(layer=i, kind="q", heads=4, head_dim=8) for i in range(2)}
    masked = {layer: [v if h in (1, 2) else 0.0 for h, v in enumerate(vals)]
              for layer, vals in LOGITS.items()}
    a, b, c = copy.deepcopy(m0), copy.deepcopy(m0), copy.deepcopy(m0)
    run(a, logits=masked, qk_layout=layout, qk_clip_threshold=100.0)
    run(b, logits=LOGITS, clip_config=dict(q_proj="*.q_proj.weight", head_dim=8, threshold=100.0,
                                           heads=[1, 2]))
    run(c, logits=LOGITS, qk_layout=layout, qk_clip_threshold=100.0)
    assert same(params_of(a), params_of(b))
    assert not same(params_of(b), params_of(c))  # heads 0 (120 > 100) and 3 were left alone


def test_clip_config_layer_regex():
    # names without an integer component: the default finds no layer; a `layer` regex does
    torch.manual_seed(1)
    w0 = torch.randn(32, 16)
    runs = []
    for kw in (dict(qk_layout={"blk3_wq": dict(layer=3, kind="q", heads=4, head_dim=8)},
                    qk_clip_threshold=100.0),
               dict(clip_config=dict(q_proj="blk*_wq", head_dim=8, threshold=100.0,
                                     layer=r"blk(\d+)_"))):
        w = nn.Parameter(w0.clone())
        opt = dt.Muon([dict(params=[("blk3_wq", w)])], lr=0.05, **kw)
        w.grad = torch.ones_like(w)
        opt.step(qk_logits={3: LOGITS[0]})
        runs.append(w.detach().clone())
    assert torch.equal(runs[0], runs[1])
    with pytest.raises(ValueError, match="no layer index in 'blk3_wq'"):
        dt.Muon([dict(params=[("blk3_wq", nn.Parameter(w0.clone()))])],
                clip_config=dict(q_proj="blk*_wq", head_dim=8))


@pytest.mark.parametrize("config,error,needle", [
    (dict(q_proj="*.query.weight", head_dim=8), ValueError,
     "clip_config\\['q_proj'\\]: '\\*.query.weight' matches no parameter name"),
    (dict(q_proj="*.q_proj.weight", k_proj="*.key.*", head_dim=8), ValueError, "'\\*.key.\\*' matches no"),
    (dict(q_proj="*.q_proj.weight"), ValueError, "needs 'head_dim'"),
    (dict(q_proj="*.q_proj.weight", head_dim=8, q_indices=[0]), ValueError, "unknown keys 'q_indices'"),
    (dict(q_proj="embed.weight", head_dim=8), ValueError, "'embed.weight', which is in an AdamW group"),
    (dict(q_proj="*_proj.weight", head_dim=8), ValueError, "layer 0 has two q_proj weights"),
    (dict(q_proj="*.q_proj.weight", k_proj="*.q_proj.weight", head_dim=8), ValueError,
     "matched by both"),
    (dict(q_proj="fc.weight", head_dim=8), ValueError, "no layer index in 'fc.weight'"),
    (dict(q_proj="*.q_proj.weight", head_dim=5), ValueError, "32 rows, not a multiple of head_dim=5"),
    (dict(q_proj="*.q_proj.weight", head_dim=8, heads=[4]), ValueError, "names head 4 but"),
    (dict(q_proj="*.q_proj.weight", head_dim=8, threshold=-1), ValueError, "threshold'\\]=-1"),
    (dict(q_proj="*.q_proj.weight", head_dim=8, layer="layers"), ValueError, "needs a group"),
    ("q_proj", TypeError, "clip_config must be a dict"),
])
def test_clip_config_errors_name_the_problem(config, error, needle):
    model = Net()
    with pytest.raises(error, match=needle):
        dt.Muon(dt.param_groups(model), clip_config=config)


def test_clip_config_conflicts():
    model = Net()
    with pytest.raises(ValueError, match="qk_clip_threshold=50.0 and clip_config\\['threshold'\\]=100.0"):
        dt.Muon(dt.param_groups(model), qk_clip_threshold=50.0,
                clip_config=dict(q_proj="*.q_proj.weight", head_dim=8, threshold=100.0))
    with pytest.raises(ValueError, match="tagged by both qk_layout and clip_config"):
        dt.Muon(dt.param_groups(model), qk_layout={model.layers[0].q_proj: dict(
            layer=0, kind="q", heads=4, head_dim=8)},
            clip_config=dict(q_proj="*.q_proj.weight", head_dim=8))
    with pytest.raises(ValueError, match="have none"):
        dt.Muon([model.layers[0].q_proj.weight], clip_config=dict(q_proj="*", head_dim=8))


# ---- profiler ranges and last_step_stats -----------------------------------------------------------

PHASES = ("meshmuon.step", "meshmuon.collect_grads", "meshmuon.engine", "meshmuon.write_back")


@pytest.mark.parametrize("engine", [None, "distributed"])
def test_profiler_ranges_appear_in_a_trace(engine, tmp_path):
    model = Net()
    opt = dt.Muon(dt.param_groups(model), engine=engine)
    set_grads(model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    names = {e.name for e in prof.events()}
    assert set(PHASES) <= names, names
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    text = trace.read_text()
    assert all(f'"{p}"' in text for p in PHASES)
    # negative control: nothing of meshmuon's in a trace without a step
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as idle:
        torch.zeros(3).add_(1)
    assert not any(e.name.startswith("meshmuon.") for e in idle.events())


NATIVE_KEYS = {"applied", "step_seconds", "pack_seconds", "comm_wait_seconds", "orthogonalize_seconds",
               "update_seconds", "agree_seconds", "comm_seconds", "overlap", "bytes_sent", "bytes_recv",
               "bytes_sent_state", "bytes_recv_state", "bytes_sent_predicted", "bytes_recv_predicted",
               "peak_buffer_bytes", "offload_bytes_in", "offload_bytes_out", "peak_state_resident_bytes",
               "chunks", "collectives"}
PY_KEYS = {"engine", "python_step_seconds", "collect_grads_seconds", "engine_call_seconds",
           "write_back_seconds", "cpu_model", "bf16_native", "bf16_products"}


@pytest.mark.parametrize("engine", [None, "distributed"])
def test_last_step_stats_on_both_engines(engine):
    model = Net()
    opt = dt.Muon(dt.param_groups(model), engine=engine)
    before = opt.last_step_stats
    assert set(before) == NATIVE_KEYS | PY_KEYS and before["applied"] is False
    assert before["step_seconds"] == 0 and before["python_step_seconds"] == 0
    set_grads(model)
    opt.step()
    stats = opt.last_step_stats
    assert set(stats) == NATIVE_KEYS | PY_KEYS
    assert stats["engine"] == (engine or "local") and stats["applied"] is True
    assert stats["step_seconds"] > 0 and stats["orthogonalize_seconds"] > 0
    assert stats["python_step_seconds"] >= stats["engine_call_seconds"] >= stats["step_seconds"] > 0
    assert stats["collect_grads_seconds"] > 0 and stats["write_back_seconds"] > 0
    assert stats["bytes_sent"] == stats["bytes_sent_predicted"] == 0  # one rank sends nothing
    assert stats["cpu_model"] == meshmuon.cpu_info()["model"]
    auto_bf16 = meshmuon.cpu_info()["auto_matmul_dtype"] == "bf16"  # ns_matmul_dtype="auto"
    assert stats["bf16_products"] == ("native" if auto_bf16 else "unused")
    # a step with no gradient at all (local: the engine does not run) leaves the stats as they were
    if engine is None:
        opt.zero_grad()
        opt.step()
        assert opt.last_step_stats["step_seconds"] == stats["step_seconds"]


# ---- product precision -----------------------------------------------------------------------------

@pytest.fixture
def fresh_precision():
    """Forgets the cached CPU information and warning; `force(path)` puts bf16 products on 'onednn'
    or 'widened' (what an AVX2-only or AVX-512-without-bf16 CPU runs) for optimizers made after it."""
    _precision._reset_for_tests()

    def force(path):
        meshmuon._core._set_bf16_products_for_tests(path)
        _precision._reset_for_tests()

    yield force
    meshmuon._core._set_bf16_products_for_tests("auto")
    _precision._reset_for_tests()


def _bf16_warnings(record):
    return [w for w in record if issubclass(w.category, dt.MeshmuonPerformanceWarning)]


def test_bf16_warning_once_and_only_where_not_native(fresh_precision):
    native = meshmuon.cpu_info()["bf16_native"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dt.Muon(dt.param_groups(Net()), ns_matmul_dtype="bf16")
    assert len(_bf16_warnings(record)) == (0 if native else 1)
    # meshmuon's widened products, as on a CPU without native bf16
    fresh_precision("widened")
    assert meshmuon.cpu_info()["bf16_products"] == "widened" and not meshmuon.cpu_info()["bf16_native"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dt.Muon(dt.param_groups(Net()))                          # auto (fp32 here): nothing to say
        assert not _bf16_warnings(record)
        model = Net()
        opt = dt.Muon(dt.param_groups(model), ns_matmul_dtype="bf16")
        dt.Muon(dt.param_groups(Net()), ns_matmul_dtype="bf16")  # once per process
        set_grads(model)
        opt.step()
    found = _bf16_warnings(record)
    assert len(found) == 1, [str(w.message) for w in found]
    msg = str(found[0].message)
    assert "ns_matmul_dtype='bf16'" in msg and meshmuon.cpu_info()["model"] in msg
    assert "same speed as fp32" in msg and " ms" in msg and "x the fp32 time" in msg
    assert "ns_matmul_dtype='auto'" in msg
    assert found[0].filename == __file__  # points at the caller
    stats = opt.last_step_stats
    assert stats["bf16_native"] is False and stats["bf16_products"] == "widened"


def test_auto_picks_bf16_only_where_native(fresh_precision):
    model = Net()
    opt = dt.Muon(dt.param_groups(model))  # ns_matmul_dtype="auto", the default
    set_grads(model)
    opt.step()
    native = meshmuon.cpu_info()["bf16_native"]
    assert meshmuon.cpu_info()["auto_matmul_dtype"] == ("bf16" if native else "fp32")
    assert opt.last_step_stats["bf16_products"] == ("native" if native else "unused")
    # auto never asks bf16 of what bf16 products exclude (gram, torch's bf16 emulation)
    for extra in (dict(ns_method="gram"), dict(ns_bf16=True)):
        model = Net()
        opt = dt.Muon(dt.param_groups(model), **extra)
        set_grads(model)
        opt.step()
        assert opt.last_step_stats["bf16_products"] == "unused", extra
    fresh_precision("widened")
    model = Net()
    opt = dt.Muon(dt.param_groups(model))
    set_grads(model)
    opt.step()
    assert meshmuon.cpu_info()["auto_matmul_dtype"] == "fp32"
    assert opt.last_step_stats["bf16_products"] == "unused"
    with pytest.raises(ValueError, match="ns_matmul_dtype"):
        dt.Muon(dt.param_groups(Net()), ns_matmul_dtype="fp16").step()


def test_bf16_warning_from_a_group_changed_before_a_step(fresh_precision):
    fresh_precision("widened")
    model = Net()
    opt = dt.Muon(dt.param_groups(model))
    set_grads(model)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        opt.step()
        assert not _bf16_warnings(record)
        opt.param_groups[0]["ns_matmul_dtype"] = "bf16"
        opt.step()
    found = _bf16_warnings(record)
    assert len(found) == 1
    assert found[0].filename == __file__  # the caller's line, through torch's step wrappers


def test_bf16_cost_is_measured_and_cached(fresh_precision):
    threads = meshmuon.blas_get_num_threads()
    cost = _precision.bf16_cost()
    assert meshmuon.blas_get_num_threads() == threads  # measured on this thread alone, nothing changed
    assert cost["error"] is None
    assert cost["fp32_seconds"] > 0 and cost["bf16_seconds"] > 0
    assert cost["bf16_over_fp32"] == pytest.approx(cost["bf16_seconds"] / cost["fp32_seconds"])
    assert _precision.bf16_cost() == cost  # cached


def _cli():
    exe = Path(meshmuon.__file__).parent / "bin" / "meshmuon"
    if not exe.exists():
        pytest.skip("the meshmuon CLI is not installed with the package")
    return str(exe)


def test_meshmuon_info_reports_what_runs_bf16_products(monkeypatch):
    monkeypatch.delenv("MESHMUON_BF16_PRODUCTS", raising=False)
    info = json.loads(subprocess.run([_cli(), "info", "--json"], check=True, capture_output=True,
                                     text=True).stdout)
    native = meshmuon.cpu_info()
    assert info["cpu_model"] == native["model"]
    assert info["bf16_products"] == native["bf16_products"] and info["bf16_kernel"] == native["bf16_kernel"]
    assert info["auto_matmul_dtype"] == native["auto_matmul_dtype"] and info["bf16_over_fp32"] > 0
    text = subprocess.run([_cli(), "info"], check=True, capture_output=True, text=True).stdout
    assert "bf16      " + native["bf16_products"] + ": " in text and "measured now:" in text
    # forced: meshmuon's widened products, and a oneDNN the CPU cannot run (an AVX2-only CPU)
    monkeypatch.setenv("MESHMUON_BF16_PRODUCTS", "widened")
    text = subprocess.run([_cli(), "info"], check=True, capture_output=True, text=True).stdout
    assert "bf16      widened: " in text and "forced by MESHMUON_BF16_PRODUCTS=widened" in text
    assert "ns_matmul_dtype auto = fp32" in text
    monkeypatch.setenv("MESHMUON_BF16_PRODUCTS", "onednn")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    text = subprocess.run([_cli(), "info"], check=True, capture_output=True, text=True).stdout
    assert "bf16      cannot run: MESHMUON_BF16_PRODUCTS=onednn, but oneDNN cannot form bf16 products" in text


def test_compare_torch_bench_prints_the_cpu_and_what_runs_bf16():
    import sys
    cmd = [sys.executable, "-m", "meshmuon.bench", "compare-torch", "--layers", "1", "--d", "32",
           "--repeat", "0"]
    result = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True,
                                       cwd="/").stdout)
    cpu = meshmuon.cpu_info()
    assert result["cpu_model"] == cpu["model"] and result["bf16_native"] == cpu["bf16_native"]
    assert result["bf16_products"] == cpu["bf16_products"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/").stdout
    assert f"CPU {cpu['model']}: meshmuon's bf16 products {cpu['bf16_products']}" in text
    assert "meshmuon.torch.Muon fp32" in text and "meshmuon.torch.Muon bf16" in text and "<- auto" in text
