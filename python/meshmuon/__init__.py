"""meshmuon: a native engine for Muon-family optimizers (Muon, Polar Express, NorMuon, MuonClip, with
AdamW for the rest) on plain or sharded parameters.

`import meshmuon` loads only the engine; `meshmuon.torch` (imported on demand) is the PyTorch adapter:
`meshmuon.torch.Muon` and `meshmuon.torch.param_groups`. See docs/python.md.
"""
import ctypes as _ctypes
import os as _os

# Open MPI 4 loads its plugins (mca_*.so) with dlopen and expects libmpi's symbols to be global, but
# Python loads extensions RTLD_LOCAL: make libmpi global before _core (which links it) is loaded.
# Harmless when MPI is absent (the engine's mpi backend then reports itself unavailable).
if _os.environ.get("MESHMUON_NO_MPI_PRELOAD") != "1":
    for _lib in ("libmpi.so.40", "libmpi.so"):
        try:
            _ctypes.CDLL(_lib, mode=_ctypes.RTLD_GLOBAL)
            break
        except OSError:
            pass

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
