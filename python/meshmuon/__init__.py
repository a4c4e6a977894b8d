"""meshmuon: a native engine for Muon-family optimizers (Muon, Polar Express, NorMuon, MuonClip, with
AdamW for the rest) on plain or sharded parameters.

`import meshmuon` loads only the engine; `meshmuon.torch` (imported on demand) is the PyTorch adapter:
`meshmuon.torch.Muon` and `meshmuon.torch.param_groups`. See docs/python.md.
"""
# MPI: _core links no libmpi. The engine loads Open MPI itself (RTLD_GLOBAL, which Open MPI's plugins
# need) when the first MPI communicator is made, so importing meshmuon works without any MPI
# (docs/decisions/038-mpi-loaded-at-run-time.md).
from ._core import (
    abort_all,
    blas_get_num_threads,
    blas_info,
    blas_set_num_threads,
    Communicator,
    cpu_info,
    MeshmuonError,
    GroupOptions,
    Inventory,
    local_box,
    LocalOptimizer,
    MachineProfile,
    make_mpi_communicator,
    make_single_communicator,
    Mesh,
    mpi_available,
    normuon_state_shape,
    ns_flops,
    NsOptions,
    Optimizer,
    Orthogonalizer,
    ParamGroup,
    ParamInfo,
    ParamSpec,
    Placement,
    QkTag,
    __version__,
)

__all__ = [
    "abort_all",
    "blas_get_num_threads",
    "blas_info",
    "blas_set_num_threads",
    "Communicator",
    "cpu_info",
    "MeshmuonError",
    "GroupOptions",
    "Inventory",
    "local_box",
    "LocalOptimizer",
    "MachineProfile",
    "make_mpi_communicator",
    "make_single_communicator",
    "Mesh",
    "mpi_available",
    "normuon_state_shape",
    "ns_flops",
    "NsOptions",
    "Optimizer",
    "Orthogonalizer",
    "ParamGroup",
    "ParamInfo",
    "ParamSpec",
    "Placement",
    "QkTag",
    "__version__",
]


def __getattr__(name):
    # `meshmuon.torch` imports torch; load it only when asked for.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'meshmuon' has no attribute {name!r}")
