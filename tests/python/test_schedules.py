# The coefficient schedules by name through meshmuon.torch.Muon: Emerging-Optimizers' tables (cans,
# aol, deepseekv4, cubic5) give bitwise the step of the same coefficients given as a custom schedule,
# and a bad step count is refused naming the schedule. (Their float64 references: tests/unit.)
import pytest
import torch

import meshmuon.torch as dt

TABLES = {
    "cans": [(8.4703, -25.1081, 18.6293), (4.1828, -3.1087, 0.5806), (3.9619, -2.9541, 0.5630),
             (3.2866, -2.4647, 0.5074), (2.2737, -1.6447, 0.4162)],
    "aol": [(4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
            (2.7215, -3.0494, 1.3169)],
    "deepseekv4": [(3.4445, -4.7750, 2.0315)] * 8 + [(2.0, -1.5, 0.5)] * 2,
    "cubic5": [(3.3656576, -3.3420992, 0.0), (2.5744352, -1.4957376, 0.0), (2.5368962, -1.4312570, 0.0),
               (2.4418906, -1.2764040, 0.0), (2.2230472, -0.9630650, 0.0)],
}


def step(**kw):
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(24, 40))
    opt = dt.Muon([dict(params=[p])], lr=0.02, **kw)
    for s in range(2):
        p.grad = torch.randn(24, 40, generator=torch.Generator().manual_seed(s))
        opt.step()
    return p.detach().clone()


@pytest.mark.parametrize("name,steps", [("cans", 5), ("cans", 7), ("aol", 6), ("deepseekv4", 10), ("cubic5", 5)])
def test_named_schedule_is_its_table(name, steps):
    table = TABLES[name]
    rows = [table[t] if t < len(table) else (table[t % len(table)] if name == "aol" else table[-1])
            for t in range(steps)]
    named = step(ns_schedule=name, ns_steps=steps)
    custom = step(ns_schedule="custom", ns_coefficients=rows, ns_steps=steps)
    assert torch.equal(named, custom)
    assert not torch.equal(named, step(ns_steps=steps))  # Jordan's: the schedule changes the step


def test_cubic5_needs_five_steps():
    with pytest.raises(ValueError, match="'cubic5' is a fixed 5-step schedule, got steps=6"):
        dt.Muon([dict(params=[torch.nn.Parameter(torch.randn(4, 6))])], ns_schedule="cubic5", ns_steps=6)
