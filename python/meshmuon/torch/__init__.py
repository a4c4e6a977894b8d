"""meshmuon.torch: the PyTorch adapter. `Muon` is a torch.optim.Optimizer whose step runs natively;
`param_groups(model)` splits a model's parameters into Muon and AdamW groups;
`init_distributed()` sets up torch's gloo group and the engine's MPI communicator under mpirun. See docs/python.md."""
from ._comms import init_distributed
from ._grad_norm import clip_grad_norm_
from ._layout.owner import OwnerPlacement, own
from .groups import classify, param_groups
from ._plan import Plan
from .options import Distribution, EngineConfig, Memory
from ._precision import MeshmuonPerformanceWarning
from .muon import Muon
from .migrate import from_dion, from_emerging_optimizers, from_motif, from_nanochat, from_torch_muon

__all__ = ["Distribution", "EngineConfig", "Memory", "MeshmuonPerformanceWarning", "Muon", "OwnerPlacement", "Plan",
           "classify", "clip_grad_norm_",
           "from_dion", "from_emerging_optimizers", "from_motif", "from_nanochat", "from_torch_muon", "init_distributed", "own",
           "param_groups"]
