"""dmuon.torch: the PyTorch adapter. `Muon` is a torch.optim.Optimizer whose step runs natively;
`param_groups(model)` splits a model's parameters into Muon and AdamW groups. See docs/python.md."""
from .groups import classify, param_groups
from .muon import Muon

__all__ = ["Muon", "classify", "param_groups"]
