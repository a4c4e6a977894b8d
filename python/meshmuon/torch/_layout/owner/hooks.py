"""Owner placement's forward and backward (placement.py's docstring, "Forward", "Backward"): a unit's
owned matrices broadcast from their owners into full compute tensors W and swapped into the module
before its forward (the next unit of the recorded order prefetched), swapped back and freed after it
(reshard_after_forward), broadcast again before the unit's backward (the previous unit prefetched);
each W's gradient handed to the reduction (reduce.py) as it is accumulated, and at the end of the
backward the reductions completed and what the backward left freed.

ForwardBackward is a part of OwnerPlacement (placement.py builds the units, groups and reducer it
reads: units, world, reshard_after_forward, _bcast_pg, _reducer, _order, _recording, _sync,
_callback_queued)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from . import checks
from .storage import _Owned, _Unit, output_tensors


class ForwardBackward:
    """The hooks of an owner placement (module docstring)."""

    def _post_unshard(self, u: _Unit) -> None:
        if u.posted:
            return
        for o in u.owned:
            o.materialize()
            if self.world > 1:
                u.works.append(dist.broadcast(o.W.data, src=o.owner, group=self._bcast_pg, async_op=True))
        u.posted = True

    def _wait_unshard(self, u: _Unit) -> None:
        self._post_unshard(u)
        for w in u.works:
            w.wait()
        u.works = []

    def _reshard(self, u: _Unit) -> None:
        for w in u.works:  # a prefetch nobody used (the unit did not run): complete it first
            w.wait()
        u.works = []
        for o in u.owned:
            o.free()
        u.posted = False

    def _neighbour(self, u: _Unit, step: int) -> Optional[_Unit]:
        if self._recording or u.pos is None:
            return None
        i = u.pos + step
        return self._order[i] if 0 <= i < len(self._order) else None

    def _pre_forward(self, u: _Unit) -> Callable:
        def hook(module: nn.Module, args: Any) -> None:
            checks.check_forward(u.owned)  # before any collective of this forward
            if self._recording:
                if u.pos is not None:       # a unit runs twice: the order is complete
                    self._recording = False
                else:
                    u.pos = len(self._order)
                    self._order.append(u)
            self._wait_unshard(u)
            for o in u.owned:
                module._parameters[o.attr] = o.W
            u.swapped = True
            nxt = self._neighbour(u, +1)
            if nxt is not None and not nxt.swapped:
                self._post_unshard(nxt)
        return hook

    def _post_forward(self, u: _Unit) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> Any:
            for o in u.owned:
                module._parameters[o.attr] = o.param
            u.swapped = False
            tensors = [t for t in output_tensors(output) if t.requires_grad]
            if tensors and any(o.param.requires_grad for o in u.owned):
                if self.reshard_after_forward:
                    self._reshard(u)
                torch.autograd.graph.register_multi_grad_hook(tensors, self._pre_backward(u), mode="any")
            elif self.reshard_after_forward or not torch.is_grad_enabled():
                self._reshard(u)
            return output
        return hook

    def _pre_backward(self, u: _Unit) -> Callable:
        def hook(grad: Any) -> None:
            self._queue_callback()
            self._recording = False
            self._wait_unshard(u)
            prev = self._neighbour(u, -1)
            if prev is not None:
                self._post_unshard(prev)
        return hook

    def _queue_callback(self) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _grad_hook(self, o: _Owned) -> Callable:
        def hook(W: torch.Tensor) -> None:
            self._queue_callback()
            g = W.grad
            W.grad = None
            if g is None:
                return
            if not self._sync:  # accumulate locally, reduce later
                g32 = g.detach().to(torch.float32)
                o.local_acc = g32.clone() if o.local_acc is None else o.local_acc.add_(g32)
            else:
                if o.local_acc is not None:
                    g = o.local_acc.add_(g.detach().to(torch.float32))
                    o.local_acc = None
                self._reducer.post(o, g.detach())
            if self.reshard_after_forward:
                o.free()
        return hook

    def _finish_backward(self) -> None:
        """End of a backward: wait for the reductions, write P.grad, free what the backward left."""
        self._callback_queued = False
        self._reducer.finish()
        for u in self.units:
            if not u.swapped:
                self._reshard(u)
