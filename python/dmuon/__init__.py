"""dmuon: a native engine for Muon-family optimizers (Muon, Polar Express, NorMuon, MuonClip, with
AdamW for the rest) on plain or sharded parameters.

`import dmuon` loads only the engine; `dmuon.torch` (imported on demand) is the PyTorch adapter:
`dmuon.torch.Muon` and `dmuon.torch.param_groups`. See docs/python.md.
"""
from ._core import (
    DmuonError,
    GroupOptions,
    LocalOptimizer,
    NsOptions,
    Orthogonalizer,
    ParamGroup,
    ParamInfo,
    QkTag,
    __version__,
    blas_get_num_threads,
    blas_info,
    blas_set_num_threads,
    ns_flops,
)

__all__ = [
    "DmuonError",
    "GroupOptions",
    "LocalOptimizer",
    "NsOptions",
    "Orthogonalizer",
    "ParamGroup",
    "ParamInfo",
    "QkTag",
    "__version__",
    "blas_get_num_threads",
    "blas_info",
    "blas_set_num_threads",
    "ns_flops",
]


def __getattr__(name):
    # `dmuon.torch` imports torch; load it only when asked for.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'dmuon' has no attribute {name!r}")
