"""meshmuon's communicator over torch.distributed (c10d): the transport behind
`make_c10d_communicator()`, so that the engine runs on the job's process group under torchrun.

The native Communicator (meshmuon/comm_transport.h) validates every call, counts bytes, applies the
deadlines and words the errors exactly as for MPI; this transport only moves data. Every
operation is posted asynchronously (`async_op=True`) and polled with `Work.is_completed()`.
What gloo lacks is built from data movement plus a LOCAL reduction in rank order (deterministic,
the contract's exact semantics: max / min exact, integer sums wrapping, bf16 sums rounded after
each addition): uneven all-gather and reduce-scatter go through `all_to_all_single` with split
sizes, bf16 / uint8 / uint64-max/min all-reduces through an all-gather. fp32 / int32 / int64 sums
and max / min use gloo's all_reduce. Point-to-point uses isend / irecv (self-sends are local copies
matched in order); gloo's send/recv Works never report completion without a wait(), so a small
daemon thread waits for each batch (threads kept for reuse, _Waiters). Buffers arrive as 1-D tensors aliasing the engine's memory.
"""
from __future__ import annotations

import inspect
import queue
import threading
from collections import deque
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from .. import _core

_TYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
          "uint64": torch.int64, "uint8": torch.uint8}
_GLOO_ALL_REDUCE = {"fp32", "int32", "int64"}  # element types gloo's all_reduce reduces exactly right
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_SIGN = -(1 << 63)  # uint64 max/min on int64 bits: flipping the sign bit makes signed order unsigned


# torch >= 2.13 names the equal-block all-gather all_gather_single (all_gather_into_tensor is
# deprecated there and warns on every call).
_ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# torch >= 2.12 can keep a new group's ranks in the order given (sort_ranks=False), which makes the
# communicator's rank order the group's (no reordering copies); torch 2.11 always sorts them. The
# transport maps communicator ranks to group ranks either way (C10dTransport.to_group).
_KEEPS_ORDER = "sort_ranks" in inspect.signature(dist.new_group).parameters


def _new_group(ranks: list[int], **kwargs):
    if _KEEPS_ORDER:
        kwargs["sort_ranks"] = False
    return dist.new_group(ranks, **kwargs)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _unpacker(rb: torch.Tensor, out: torch.Tensor, counts, displs, order, e: int):
    """The copy-out that lands blocks received back to back in `out` (in `order`) at their
    displacements in the receive buffer `rb` (bytes), once the exchange completed."""
    def finish() -> None:
        at = 0
        for j in order:
            n = counts[j] * e
            rb[displs[j] * e:displs[j] * e + n] = out[at:at + n]
            at += n
    return finish


def _packed(counts: list[int], displs: list[int], order: list[int]) -> Optional[int]:
    """The start of blocks laid out back to back in `order` (displs in elements), else None."""
    if not order:
        return 0
    at = start = displs[order[0]]
    for j in order:
        if counts[j] and displs[j] != at:
            return None
        at += counts[j]
    return start


def _reduce(blocks: list[torch.Tensor], op: str, dtype: str) -> torch.Tensor:
    """blocks (typed, equal length) reduced in list order (rank order): a new tensor."""
    if dtype == "uint64" and op != "sum":
        blocks = [torch.bitwise_xor(b, _SIGN) for b in blocks]
    acc = blocks[0].clone()
    for b in blocks[1:]:
        if op == "sum":
            acc.add_(b)  # bf16: computed in fp32, rounded to bf16 after each addition
        elif op == "max":
            torch.maximum(acc, b, out=acc)
        else:
            torch.minimum(acc, b, out=acc)
    if dtype == "uint64" and op != "sum":
        acc = torch.bitwise_xor(acc, _SIGN)
    return acc


class _Op:
    """Posted c10d Works; test() polls them, then runs `finish` (unpack, reduce) once."""
    __slots__ = ("_works", "_finish", "_keep")

    def __init__(self, works: list, finish: Optional[Callable[[], None]] = None, keep: Any = None):
        self._works, self._finish, self._keep = list(works), finish, keep

    def test(self) -> bool:
        works = self._works
        while works:
            if not works[-1].is_completed():
                return False
            works.pop().wait()  # completed: raises the op's error, if any
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        self._keep = None
        return True


class _Match:
    """One self-send or self-recv waiting for its partner (local copies)."""
    __slots__ = ("buf", "done", "error")

    def __init__(self, buf: torch.Tensor):
        self.buf, self.done, self.error = buf, False, None


class _Waiters:
    """Daemon threads that wait batches of gloo send / recv Works, one batch per thread at a time
    (a batch never waits behind another), kept idle for the next batch: starting a thread per batch
    cost ~4 ms on a loaded CPU (the new thread must be scheduled before start() returns), twice per
    optimizer step on two ranks."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list = []  # the queues of idle threads

    def submit(self, op: "_P2pOp", works: list) -> None:
        with self._lock:
            q = self._idle.pop() if self._idle else None
        if q is None:
            q = queue.SimpleQueue()
            threading.Thread(target=self._run, args=(q,), daemon=True, name="meshmuon-c10d-p2p").start()
        q.put((op, works))

    def _run(self, q: "queue.SimpleQueue") -> None:
        while True:
            op, works = q.get()
            error = None
            try:
                for w in works:
                    w.wait()
            except BaseException as e:  # reported by test() on the driving thread
                error = e
            with self._lock:  # idle before the batch reports done: the next batch reuses it
                self._idle.append(q)
            op._waited(error)


_WAITERS = _Waiters()


class _P2pOp:
    """A p2p batch: remote sends / recvs waited by a daemon thread (gloo's send/recv Works complete
    only inside wait()), self ones matched locally."""
    __slots__ = ("_thread_done", "_error", "_matches", "_keep")

    def __init__(self, works: list, matches: list[_Match], keep: Any):
        self._matches, self._keep, self._error = matches, keep, None
        self._thread_done = not works
        if works:
            _WAITERS.submit(self, works)

    def _waited(self, error: Optional[BaseException]) -> None:
        self._error = error
        self._thread_done = True

    def test(self) -> bool:
        for m in self._matches:
            if m.error:
                raise RuntimeError(m.error)
        if not self._thread_done or not all(m.done for m in self._matches):
            return False
        if self._error is not None:
            raise self._error
        self._keep = None
        return True


class C10dTransport:
    """The transport of one meshmuon communicator: `group` (a ProcessGroup; None is the default
    group) with communicator rank i on global rank members[i]."""

    backend = "c10d"

    def __init__(self, group: Optional[Any], members: list[int]):
        self.group = group
        self.members = list(members)
        self.size = len(members)
        me = dist.get_rank()
        self.rank = self.members.index(me)
        pg_ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        # communicator rank -> rank in the process group, and back
        self.to_group = [pg_ranks.index(g) for g in self.members]
        self.order = sorted(range(self.size), key=lambda i: self.to_group[i])  # pg rank -> comm rank
        self.identity = self.to_group == list(range(self.size))
        self._self_sends: deque = deque()
        self._self_recvs: deque = deque()

    # ---- collectives ---------------------------------------------------------------------------

    def _a2a(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int]):
        """all_to_all_single of bytes; splits in process-group rank order."""
        return dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group, async_op=True)

    def all_to_all_v(self, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype):
        e = send.element_size()
        if self.size == 1:
            recv[recv_displs[0]:recv_displs[0] + recv_counts[0]] = \
                send[send_displs[0]:send_displs[0] + send_counts[0]]
            return None
        sb, rb = _bytes(send), _bytes(recv)
        order = self.order
        s0 = _packed(send_counts, send_displs, order)
        if s0 is not None:
            inp = sb[s0 * e:(s0 + sum(send_counts)) * e]
        else:
            inp = torch.cat([sb[send_displs[j] * e:(send_displs[j] + send_counts[j]) * e] for j in order])
        r0 = _packed(recv_counts, recv_displs, order)
        total = sum(recv_counts)
        out = rb[r0 * e:(r0 + total) * e] if r0 is not None else torch.empty(total * e, dtype=torch.uint8)
        work = self._a2a(out, inp, [recv_counts[j] * e for j in order], [send_counts[j] * e for j in order])
        finish = None if r0 is not None else _unpacker(rb, out, recv_counts, recv_displs, order, e)
        return _Op([work], finish, (inp, out, send, recv))

    def all_gather_v(self, send, recv, counts, displs, dtype):
        e = send.element_size()
        if self.size == 1:
            recv[displs[0]:displs[0] + counts[0]] = send
            return None
        sb, rb = _bytes(send), _bytes(recv)
        order = self.order
        r0 = _packed(counts, displs, order)
        total = sum(counts)
        if r0 is not None and len(set(counts)) == 1:
            out = rb[r0 * e:(r0 + total) * e]
            work = _ALL_GATHER_SINGLE(out, sb, group=self.group, async_op=True)
            return _Op([work], None, (send, recv, out))
        out = rb[r0 * e:(r0 + total) * e] if r0 is not None else torch.empty(total * e, dtype=torch.uint8)
        inp = sb.repeat(self.size)  # the same block to every rank
        work = self._a2a(out, inp, [counts[j] * e for j in order], [counts[self.rank] * e] * self.size)
        finish = None if r0 is not None else _unpacker(rb, out, counts, displs, order, e)
        return _Op([work], finish, (inp, out, send, recv))

    def reduce_scatter_v(self, send, recv, counts, op, dtype):
        e = send.element_size()
        mine = counts[self.rank]
        if self.size == 1:
            recv[:mine] = send[:mine]
            return None
        sb = _bytes(send)
        order = self.order
        starts = [0] * self.size
        at = 0
        for j in range(self.size):
            starts[j], at = at, at + counts[j]
        if self.identity:
            inp = sb
        else:
            inp = torch.cat([sb[starts[j] * e:(starts[j] + counts[j]) * e] for j in order])
        out = torch.empty(self.size * mine * e, dtype=torch.uint8)
        work = self._a2a(out, inp, [mine * e] * self.size, [counts[j] * e for j in order])
        typed = _TYPES[dtype]

        def finish():
            blocks = out.view(typed).view(self.size, mine) if mine else None
            if blocks is None:
                return
            by_rank = [None] * self.size
            for g, j in enumerate(order):  # pg rank g holds comm rank j's block
                by_rank[j] = blocks[g]
            recv[:mine] = _reduce(by_rank, op, dtype)
        return _Op([work], finish, (inp, out, send, recv))

    def all_reduce(self, send, recv, op, dtype):
        n = recv.numel()
        if send.data_ptr() != recv.data_ptr():  # else in place
            recv.copy_(send)
        if self.size == 1 or n == 0:
            return None
        if dtype in _GLOO_ALL_REDUCE:
            work = dist.all_reduce(recv, op=_OPS[op], group=self.group, async_op=True)
            return _Op([work], None, recv)
        # gather every rank's buffer (data movement), reduce locally in rank order
        e = recv.element_size()
        inp = _bytes(recv).repeat(self.size)
        out = torch.empty(self.size * n * e, dtype=torch.uint8)
        work = self._a2a(out, inp, [n * e] * self.size, [n * e] * self.size)
        typed = _TYPES[dtype]
        order = self.order

        def finish():
            blocks = out.view(typed).view(self.size, n)
            by_rank = [None] * self.size
            for g, j in enumerate(order):
                by_rank[j] = blocks[g]
            recv.copy_(_reduce(by_rank, op, dtype))
        return _Op([work], finish, (inp, out, recv))

    def broadcast(self, buf, root, dtype):
        if self.size == 1 or buf.numel() == 0:
            return None
        b = _bytes(buf)
        work = dist.broadcast(b, group=self.group, group_src=self.to_group[root], async_op=True)
        return _Op([work], None, (b, buf))

    def barrier(self):
        if self.size == 1:
            return None
        return _Op([dist.barrier(group=self.group, async_op=True)])

    # ---- point-to-point ------------------------------------------------------------------------

    def p2p(self, batch):
        works, matches, keep = [], [], []
        for is_send, peer, t in batch:
            b = _bytes(t)
            keep.append(b)
            if peer == self.rank:
                matches.append(self._match_self(is_send, b))
            elif is_send:
                works.append(dist.isend(b, group=self.group, group_dst=self.to_group[peer]))
            else:
                works.append(dist.irecv(b, group=self.group, group_src=self.to_group[peer]))
        return _P2pOp(works, matches, keep)

    def _match_self(self, is_send: bool, buf: torch.Tensor) -> _Match:
        """Pairs a self-send or self-recv with the oldest unmatched one of the other kind (the
        order rule of comm.h), copying at once, or queues it."""
        mine = _Match(buf)
        partners = self._self_recvs if is_send else self._self_sends
        if not partners:
            (self._self_sends if is_send else self._self_recvs).append(mine)
            return mine
        other = partners.popleft()
        s, r = (mine, other) if is_send else (other, mine)
        if s.buf.numel() > r.buf.numel():
            s.error = r.error = (f"[c10d] rank {self.rank}: a send to itself of {s.buf.numel()} bytes "
                                 f"met a recv of {r.buf.numel()} bytes; both ends must pass the same "
                                 f"count and type")
        else:
            r.buf[:s.buf.numel()] = s.buf
        mine.done = other.done = True
        return mine

    # ---- sub-communicators ---------------------------------------------------------------------

    def split(self, colors: list[int], keys: list[int], name: str) -> Optional["C10dTransport"]:
        """Called on every rank after the communicator all-gathered (color, key) of all ranks.
        Spanning the whole job: every rank creates every new group, in color order (new_group is
        collective over the default group). Otherwise only the members of each new group create it
        (use_local_synchronization). Group ranks follow (key, rank), like MPI_Comm_split."""
        by_color: dict[int, list[tuple[int, int]]] = {}
        for i, (c, k) in enumerate(zip(colors, keys)):
            if c >= 0:
                by_color.setdefault(c, []).append((k, i))
        members = {c: [self.members[i] for _, i in sorted(v)] for c, v in by_color.items()}
        mine = colors[self.rank]
        whole_job = sorted(self.members) == list(range(dist.get_world_size()))
        if whole_job:
            result = None
            for c in sorted(members):
                pg = _new_group(members[c], group_desc=f"meshmuon {name}")
                if c == mine:
                    result = C10dTransport(pg, members[c])
            return result
        if mine < 0:
            return None
        pg = _new_group(members[mine], use_local_synchronization=True, group_desc=f"meshmuon {name}")
        return C10dTransport(pg, members[mine])

    def on_timeout(self) -> None:
        """Nothing to cancel: gloo keeps the posted op; the job must end (meshmuon.abort_all)."""


def make_c10d_communicator(group: Optional[Any] = None, name: str = "world") -> "_core.Communicator":
    """A meshmuon Communicator over torch.distributed's process group `group` (default: the default
    group, i.e. the whole job). Local (posts nothing); torch.distributed must be initialised."""
    if not dist.is_initialized():
        raise RuntimeError("[c10d] torch.distributed is not initialised: call "
                           "meshmuon.torch.init_distributed() (or dist.init_process_group) first")
    members = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    transport = C10dTransport(group, members)
    return _core.make_transport_communicator(transport, transport.rank, transport.size, name,
                                            dist.get_rank())
