# meshmuon._core.make_nccl_communicator: the nccl communicator bootstrapped through a Python exchange
# callable (how meshmuon.torch can bootstrap it from torch.distributed). Without a GPU (or without CUDA
# in the build) it raises meshmuon's error naming the cause; with one, a world of one rank comes up.
import pytest
import torch

from meshmuon import _core


def _self_exchange(blob):
    # an NcclHello: this rank's ok flag and reason, then rank 0's ncclUniqueId (128 bytes)
    assert isinstance(blob, bytes) and len(blob) == 512
    return blob


def test_nccl_communicator_or_a_clear_error():
    if _core.nccl_available() and torch.cuda.is_available():
        comm = _core.make_nccl_communicator(_self_exchange, 0, 1)
        assert comm.name == "world"
        assert comm.counters() == {"bytes_sent": 0, "bytes_recv": 0, "collectives": 0}
        return
    with pytest.raises(_core.MeshmuonError) as err:
        _core.make_nccl_communicator(_self_exchange, 0, 1)
    msg = str(err.value)
    if _core.nccl_available():
        assert msg.startswith("[nccl] rank 0: no CUDA device: "), msg
    else:
        assert msg.startswith("[nccl] meshmuon was built without"), msg


def test_nccl_exchange_must_be_callable_and_return_bytes():
    with pytest.raises(TypeError, match="exchange must be a callable"):
        _core.make_nccl_communicator(3, 0, 1)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        _core.make_nccl_communicator(_self_exchange, 2, 1)
