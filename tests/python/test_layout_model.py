# The adapter's layout model (meshmuon.torch._layout, decision 059): layout_of answers for a plain
# tensor, an owned matrix (Owned(k), registered by owner placement) and a DTensor; the engine's mesh,
# placements and box follow, and the consumers' questions (placed, held_here, spread) have one answer.
import socket
import subprocess
import sys
import textwrap

import torch

from meshmuon.torch import _layout
from meshmuon.torch._layout import SPREAD_REPLICATED, SPREAD_WORLD, Owned, layout_of


class _Record:  # what owner placement registers (owner/storage.py's _Owned): param, shape, owner, is_owner
    def __init__(self, param, shape, owner, is_owner):
        self.param, self.shape, self.owner, self.is_owner = param, shape, owner, is_owner


def test_a_plain_tensor_is_whole_and_replicated():
    p = torch.zeros(6, 4)
    lay = layout_of(p)
    assert lay.shape == (6, 4) and lay.local is p and lay.all_placements() == ()
    assert not lay.placed and lay.held_here and lay.spread == SPREAD_REPLICATED
    assert lay.engine_mesh(1, "p") == ((), [])
    key, placements = lay.engine_mesh(3, "p")
    assert key == (("world", 3),) and [str(pl) for pl in placements] == [str(_layout._core.Placement.replicate())]
    assert lay.box(3, 2) == [[(0, 6)], [(0, 4)]]
    assert lay.wrap(p) is p and lay.local_grad(None, "p") is None


def test_an_owned_matrix_is_owned_k_on_the_world():
    here = torch.nn.Parameter(torch.zeros(0, 5))  # a non-owner's box: [0, cols]
    record = _Record(here, (7, 5), owner=2, is_owner=False)
    _layout.register_owned(record)
    lay = layout_of(here)
    assert lay.shape == (7, 5) and lay.owner == 2 and lay.all_placements() == (Owned(2),)
    assert lay.placed and not lay.held_here and lay.spread == SPREAD_WORLD
    assert "owned by rank 2" in lay.describe()
    assert lay.box(3, 2) == [[(0, 7)], [(0, 5)]]  # whole on its owner
    assert sum(e - b for b, e in lay.box(3, 0)[0]) == 0  # empty elsewhere
    assert record in _layout.owned_records()
    # negative control: a tensor owner placement did not register is plain
    assert layout_of(torch.zeros(0, 5)).owner is None
    del record  # weakly held: a dropped placement leaves no entry
    import gc
    gc.collect()
    assert layout_of(here).owner is None


_DTENSOR = r'''
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from meshmuon.torch._layout import SPREAD_MESH, layout_of
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
d = distribute_tensor(torch.arange(12.).reshape(4, 3), mesh, [Shard(0)])
lay = layout_of(d)
assert lay.shape == (4, 3) and lay.local is d._local_tensor and lay.placements == (Shard(0),)
assert lay.placed and lay.held_here and lay.spread == SPREAD_MESH and "DTensor" in lay.describe()
key, placements = lay.engine_mesh(1, "d")
assert key == (("dp", 1),) and len(placements) == 1
assert lay.box(1, 0) == [[(0, 4)], [(0, 3)]]
w = lay.wrap(torch.zeros(4, 3))
assert type(w).__name__ == "DTensor" and w.placements == (Shard(0),) and tuple(w.shape) == (4, 3)
assert lay.local_of(w) is w._local_tensor
dist.destroy_process_group()
print("ok")
'''


def test_a_dtensor_keeps_its_mesh_and_placements():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_DTENSOR), str(port)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
