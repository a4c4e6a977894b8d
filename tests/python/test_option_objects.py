# meshmuon.torch.Muon's option objects (meshmuon.torch.options): EngineConfig, Distribution and Memory
# give the same optimizer as the keywords they group (the old spelling still works), with the same
# validation messages, and refuse a field given both ways, an unknown keyword and a wrong object.
import copy

import pytest
import torch
from torch import nn

import meshmuon.torch as dt
from meshmuon.torch.options import FIELD_OF


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8, bias=False))


def trained(**kw):
    m = model()
    opt = dt.Muon(dt.param_groups(m), lr=0.02, **kw)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for p in m.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return m, opt


CONFIG = ("_zero", "_dist_options", "_strategy", "_none_grad", "_comm_dtype", "_threads", "_offload_state",
          "_engine_kind", "_non_finite")


def config(opt):
    out = {}
    for key in CONFIG:
        value = getattr(opt, key)
        out[key] = vars(value) if key == "_zero" else value
    return out


def test_objects_and_keywords_build_the_same_optimizer_bitwise():
    kw = dict(threads=1, non_finite="skip", comm_dtype="bf16", window=3, chunk_bytes=1 << 20, replica="auto",
              timeout_s=30.0, allow_inexact=False, offload_state=True, none_grad=False)
    m1, by_keyword = trained(engine="local", **kw)
    m2, by_object = trained(engine=dt.EngineConfig(kind="local", threads=1, non_finite="skip"),
                            distribution=dt.Distribution(comm_dtype="bf16", window=3, chunk_bytes=1 << 20,
                                                         timeout_s=30.0),
                            memory=dt.Memory(offload_state=True))
    assert config(by_keyword) == config(by_object)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
    assert by_object.engine == "local"


def test_the_defaults_are_the_keywords_defaults():
    _, plain = trained()
    _, objects = trained(engine=dt.EngineConfig(), distribution=dt.Distribution(), memory=dt.Memory())
    assert config(plain) == config(objects)


def test_a_copy_keeps_the_options():
    _, opt = trained(memory=dt.Memory(none_grad=True), engine=dt.EngineConfig(threads=1))
    clone = copy.deepcopy(opt)
    assert clone._none_grad is True and clone._threads == 1


@pytest.mark.parametrize("kw,needle", [
    (dict(window=0), "window=0"),
    (dict(comm_dtype="fp16"), "comm_dtype='fp16'; use 'fp32' or 'bf16'"),
    (dict(threads=0), "threads=0"),
    (dict(reduce_grads="mean"), "needs zero=True"),
    (dict(non_finite="ignore"), "non_finite='ignore'; use 'raise' or 'skip'"),
])
def test_bad_values_raise_the_same_message_both_ways(kw, needle):
    (name, value), = kw.items()
    arg, cls = FIELD_OF[name]
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")) as by_keyword:
        dt.Muon(dt.param_groups(model()), **kw)
    with pytest.raises(ValueError) as by_object:
        dt.Muon(dt.param_groups(model()), **{arg: cls(**kw)})
    assert str(by_keyword.value) == str(by_object.value)


def test_a_field_given_twice_is_refused():
    with pytest.raises(TypeError, match="'window' is given twice"):
        dt.Muon(dt.param_groups(model()), window=4, distribution=dt.Distribution(window=2))
    with pytest.raises(TypeError, match="'threads' is given twice"):
        dt.Muon(dt.param_groups(model()), threads=1, engine=dt.EngineConfig())


def test_unknown_keywords_and_wrong_objects_are_refused():
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'windw' \(did you mean 'window'\?\)"):
        dt.Muon(dt.param_groups(model()), windw=4)
    with pytest.raises(TypeError, match="'kind'"):
        dt.Muon(dt.param_groups(model()), kind="local")
    with pytest.raises(TypeError, match=r"Muon\(memory=...\) takes a meshmuon.torch.Memory"):
        dt.Muon(dt.param_groups(model()), memory=dt.Distribution())
    with pytest.raises(TypeError, match=r"Muon\(engine=...\) takes a meshmuon.torch.EngineConfig or a kind"):
        dt.Muon(dt.param_groups(model()), engine=dt.Memory())
    with pytest.raises(ValueError, match="engine='fast'"):
        dt.Muon(dt.param_groups(model()), engine="fast")


def test_the_signature_reads_in_three_groups():
    import inspect
    params = list(inspect.signature(dt.Muon.__init__).parameters)
    assert params[:10] == ["self", "params", "lr", "weight_decay", "momentum", "nesterov", "ns_coefficients",
                           "eps", "ns_steps", "adjust_lr_fn"]
    assert params[-4:] == ["engine", "distribution", "memory", "option_fields"]
    assert len(params) <= 32
