"""Owner placement's gradient reduction: each rank's gradient of an owned matrix to its owner, the
mean in a fixed, documented order (placement.py's docstring): converted to reduce_dtype, every
element summed in fp32 in rank order 0, 1, ..., W-1, one division by W. Bitwise reproducible and
the same whatever the process group's algorithms. Two ways to the same bits: "scatter_gather" (row
block b of every rank's gradient to rank b, which sums it and sends the sum to the owner: two
all-to-alls) and "gather" (every rank's gradient to the owner in row blocks of at most
`bucket_bytes`: a star)."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .storage import _Owned

REDUCE_MODES = ("auto", "scatter_gather", "gather")


class GradReducer:
    """The reductions of one backward, posted as the gradients arrive (post) and completed at its end
    (finish), on process group `group` (the placement's own)."""

    def __init__(self, world: int, rank: int, group: Any, reduce: str, reduce_dtype: torch.dtype,
                 bucket_bytes: int):
        self.world, self.rank, self.group = world, rank, group
        self.reduce, self.reduce_dtype, self.bucket_bytes = reduce, reduce_dtype, bucket_bytes
        self._pending: list[tuple[_Owned, list[Any], list[Any], list[tuple[int, int]]]] = []
        self._scattering: list[tuple[_Owned, Any, torch.Tensor, int]] = []  # scatter_gather's first stage

    def _blocks(self, o: _Owned) -> list[tuple[int, int]]:
        per_row = o.shape[1] * (4 if self.reduce_dtype == torch.float32 else 2) * max(self.world, 1)
        rows = max(1, self.bucket_bytes // max(per_row, 1))
        return [(b, min(b + rows, o.shape[0])) for b in range(0, o.shape[0], rows)] or [(0, 0)]

    def _rows(self, o: _Owned) -> list[int]:
        """scatter_gather's row blocks: rank b sums rows [sum(rows[:b]), +rows[b]) (as even as can be)."""
        base, extra = divmod(o.shape[0], self.world)
        return [base + (1 if b < extra else 0) for b in range(self.world)]

    def post(self, o: _Owned, g: torch.Tensor) -> None:
        """Posts the reduction of this rank's gradient `g` of owned matrix `o` (every rank, in the
        same order: the backward's)."""
        g = g.to(self.reduce_dtype).contiguous()
        if self.world == 1:
            self._pending.append((o, [], [g], []))
            return
        if self.reduce == "scatter_gather":
            # stage 1: every rank sends row block b to rank b (a reduce-scatter by data movement)
            rows = self._rows(o)
            mine = rows[self.rank]
            recv = g.new_empty((self.world * mine, o.shape[1]))
            work = dist.all_to_all_single(recv, g, [mine] * self.world, rows, group=self.group, async_op=True)
            self._scattering.append((o, work, recv, mine))
            while len(self._scattering) > 2:  # stage 2 of the oldest, deterministically two behind
                self._gather_sums(*self._scattering.pop(0))
            return
        works, parts, blocks = [], [], self._blocks(o)
        for b, e in blocks:
            mine = g[b:e]
            gather = [torch.empty_like(mine) for _ in range(self.world)] if o.is_owner else None
            works.append(dist.gather(mine, gather, dst=o.owner, group=self.group, async_op=True))
            parts.append((mine, gather))
        self._pending.append((o, works, parts, blocks))

    def _gather_sums(self, o: _Owned, work: Any, recv: torch.Tensor, mine: int) -> None:
        """scatter_gather's stage 2: this rank's block summed in fp32 in rank order, sent to the owner."""
        work.wait()
        acc = torch.empty((mine, o.shape[1]), dtype=torch.float32, device=recv.device)
        if mine:
            acc.copy_(recv[:mine])
            for r in range(1, self.world):
                acc.add_(recv[r * mine:(r + 1) * mine].to(torch.float32))
        rows = self._rows(o)
        send = [0] * self.world
        send[o.owner] = mine
        out = acc.new_empty((o.shape[0] if o.is_owner else 0, o.shape[1]))
        w2 = dist.all_to_all_single(out, acc, rows if o.is_owner else [0] * self.world, send,
                                    group=self.group, async_op=True)
        self._pending.append((o, [w2], [("sums", out, acc)], [(0, o.shape[0])]))

    def finish(self) -> None:
        """End of a backward: waits for every posted reduction and writes P.grad: on the owner the
        mean in fp32, added to an existing P.grad; elsewhere an empty [0, cols] gradient."""
        while self._scattering:
            self._gather_sums(*self._scattering.pop(0))
        for o, works, parts, blocks in self._pending:
            for w in works:
                w.wait()
            if not o.is_owner:
                if o.param.grad is None:
                    o.param.grad = o.param.data.new_empty((0, o.shape[1]))
                continue
            if self.world == 1:
                total = parts[0].to(torch.float32, copy=True)
            elif parts and isinstance(parts[0], tuple) and parts[0][0] == "sums":
                total = parts[0][1]  # scatter_gather: the owner received every block's fp32 sum
            else:
                total = torch.empty(o.shape, dtype=torch.float32, device=o.param.device)
                for (b, e), (_, gather) in zip(blocks, parts):
                    acc = total[b:e]
                    acc.copy_(gather[0])
                    for r in range(1, self.world):  # fp32, rank order
                        acc.add_(gather[r].to(torch.float32))
            total.div_(self.world)
            if o.param.grad is None:
                o.param.grad = total.to(o.param.dtype)
            else:
                o.param.grad.add_(total.to(o.param.grad.dtype))
        self._pending = []
