"""Cases of the c10d communicator (meshmuon/torch/_c10d.py), run by test_torchrun.py under torchrun
(or mpirun for `bytes`, which compares both communicators in one job). Prints "CASE <name> OK" on
rank 0 per passing case; any failure aborts the job (exit code != 0).
- transport: every transport operation against its exact meaning (uneven and scattered blocks,
  a communicator whose rank order is the reverse of the process group's, bf16 sums rounded after
  each addition, uint64 max/min above 2^63, uint8 sums wrapping, self-sends matched in order).
- timeout: rank 1 never steps; the others raise meshmuon.MeshmuonError naming the op within
  MESHMUON_TIMEOUT_S (then the job ends through os._exit: communication is unusable).
- hold: an optimizer kept alive past exit by a daemon thread is still released at exit.
- nccl_bootstrap: the nccl communicator for CUDA parameters (meshmuon/torch/_comms.py), bootstrapped
  over torch.distributed: every rank joins the one all_gather_object exchange and, on a machine
  without a GPU, every rank raises meshmuon.MeshmuonError naming its missing device (no hang).
- bytes (under mpirun): the same plain-tensor step on the MPI and on the c10d communicator gives
  bitwise the same parameters and the same byte counters (and both equal the plan's prediction).
Run by hand: python -m torch.distributed.run --standalone --nproc-per-node 3 c10d_cases.py --cases transport
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
import torch.nn as nn

torch.set_num_threads(1)

import meshmuon  # noqa: E402
import meshmuon.torch as dt  # noqa: E402
from harness import guarded, run_cases, say  # noqa: E402
import torch.distributed as dist  # noqa: E402
from meshmuon.torch import _c10d, _comms  # noqa: E402


def done(op) -> None:
    """Polls a transport op handle (None: complete already) to completion."""
    t0 = time.time()
    while op is not None and not op.test():
        assert time.time() - t0 < 60, "transport op did not complete"
        time.sleep(0.0005)


def bf16_sum_in_order(blocks: list[torch.Tensor]) -> torch.Tensor:
    """bf16 sum rounded after each addition, in list order, element by element in Python floats."""
    out = []
    for i in range(blocks[0].numel()):
        acc = blocks[0][i].float()
        for b in blocks[1:]:
            acc = (acc + b[i].float()).to(torch.bfloat16).float()
        out.append(acc)
    return torch.stack(out).to(torch.bfloat16)


def check_transport(t: _c10d.C10dTransport, tag: str) -> None:
    n, r = t.size, t.rank
    # all_to_all_v: rank r sends (r + j + 1) elements to j, blocks scattered with gaps, reversed
    send_counts = [r + j + 1 for j in range(n)]
    send_displs, at = [0] * n, 0
    for j in reversed(range(n)):
        send_displs[j], at = at, at + send_counts[j] + 1
    send = torch.full((at,), -1.0)
    for j in range(n):
        send[send_displs[j]:send_displs[j] + send_counts[j]] = 100 * r + j + torch.arange(send_counts[j])
    recv_counts = [j + r + 1 for j in range(n)]
    recv_displs, at = [0] * n, 2
    for j in range(n):
        recv_displs[j], at = at, at + recv_counts[j] + 2
    recv = torch.full((at,), -7.0)
    done(t.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, "fp32"))
    want = torch.full((at,), -7.0)
    for j in range(n):
        want[recv_displs[j]:recv_displs[j] + recv_counts[j]] = 100 * j + r + torch.arange(recv_counts[j])
    assert torch.equal(recv, want), (tag, "all_to_all_v", recv, want)

    # all_gather_v, uneven (rank j contributes j + 2 int64), blocks in reverse rank order
    counts = [j + 2 for j in range(n)]
    displs, at = [0] * n, 0
    for j in reversed(range(n)):
        displs[j], at = at, at + counts[j]
    mine = torch.arange(counts[r], dtype=torch.int64) + 1000 * r
    out = torch.zeros(at, dtype=torch.int64)
    done(t.all_gather_v(mine, out, counts, displs, "int64"))
    for j in range(n):
        assert torch.equal(out[displs[j]:displs[j] + counts[j]],
                           torch.arange(counts[j], dtype=torch.int64) + 1000 * j), (tag, "all_gather_v")

    # reduce_scatter_v, bf16 sum rounded after each addition in rank order (values chosen so the
    # order matters: 1 + 2^-8 + 2^-8 differs from 1 + (2^-8 + 2^-8) in bf16)
    counts = [3 + j for j in range(n)]
    g = torch.Generator().manual_seed(11)
    table = [torch.randn(sum(counts), generator=g).to(torch.bfloat16) for _ in range(n)]
    for k in range(n):
        table[k][0] = 1.0 if k == 0 else 2.0 ** -8
    got = torch.zeros(counts[r] + 1, dtype=torch.bfloat16)
    done(t.reduce_scatter_v(table[r].clone(), got, counts, "sum", "bf16"))
    start = sum(counts[:r])
    want = bf16_sum_in_order([table[k][start:start + counts[r]] for k in range(n)])
    assert torch.equal(got[:counts[r]].view(torch.int16), want.view(torch.int16)), (tag, "bf16 rs", got, want)
    assert got[counts[r]] == 0

    # all_reduce: uint64 max/min above 2^63 (as int64 bits), uint8 sum wrapping, int64 sum, fp32 max
    big = [(1 << 63) + 5 * k for k in range(n)] + [3 * k for k in range(n)]
    as_i64 = lambda v: v - (1 << 64) if v >= 1 << 63 else v  # noqa: E731
    vals = torch.tensor([as_i64(big[r]), as_i64(big[n + r])], dtype=torch.int64)
    for op, pick in (("max", max), ("min", min)):
        x = vals.clone()
        done(t.all_reduce(x, x, op, "uint64"))
        want = [as_i64(pick(big[:n])), as_i64(pick(big[n:]))]
        assert x.tolist() == want, (tag, "uint64", op, x.tolist(), want)
    u8 = torch.tensor([200, r], dtype=torch.uint8)
    out8 = torch.zeros(2, dtype=torch.uint8)
    done(t.all_reduce(u8, out8, "sum", "uint8"))
    assert out8.tolist() == [(200 * n) % 256, sum(range(n)) % 256], (tag, "uint8", out8)
    i64 = torch.tensor([r + 1, -r], dtype=torch.int64)
    done(t.all_reduce(i64, i64, "sum", "int64"))
    assert i64.tolist() == [n * (n + 1) // 2, -(n * (n - 1) // 2)], (tag, "int64", i64)
    f = torch.tensor([float(r), -float(r)])
    done(t.all_reduce(f, f, "max", "fp32"))
    assert f.tolist() == [n - 1.0, 0.0], (tag, "fp32 max", f)

    # broadcast from the last rank
    b = torch.full((5,), float(r))
    done(t.broadcast(b, n - 1, "fp32"))
    assert torch.equal(b, torch.full((5,), float(n - 1))), (tag, "broadcast", b)
    done(t.barrier())

    # p2p: a ring plus two self-messages matched in order, one batch
    right, left = (r + 1) % n, (r - 1) % n
    s_ring = torch.arange(4, dtype=torch.float32) + 10 * r
    r_ring = torch.zeros(4)
    s1, s2 = torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([4, 5, 6], dtype=torch.int32)
    r1, r2 = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    done(t.p2p([(True, right, s_ring), (False, left, r_ring), (True, r, s1), (True, r, s2),
                (False, r, r1), (False, r, r2)]))
    assert torch.equal(r_ring, torch.arange(4, dtype=torch.float32) + 10 * left), (tag, "ring", r_ring)
    assert r1.tolist() == [1, 2, 3] and r2.tolist() == [4, 5, 6], (tag, "self p2p", r1, r2)
    # negative control: a self-send larger than its recv is an error
    try:
        done(t.p2p([(True, r, torch.zeros(4)), (False, r, torch.zeros(3))]))
    except RuntimeError as e:
        assert "met a recv" in str(e), str(e)
    else:
        raise AssertionError("a mismatched self-message was accepted")


def case_transport() -> None:
    world, me = dist.get_world_size(), dist.get_rank()
    t = _c10d.C10dTransport(None, list(range(world)))
    check_transport(t, "world")
    # a communicator over the job in reverse order: comm rank i is global rank world-1-i
    rev = t.split([0] * world, [world - 1 - k for k in range(world)], "reverse")
    assert rev.members == list(reversed(range(world))) and rev.rank == world - 1 - me, rev.members
    check_transport(rev, "reverse")
    # a sub-communicator (ranks 0 and 2 of 3, or the even ranks) split again, members only
    if world >= 3:
        colors = [0 if k % 2 == 0 else -1 for k in range(world)]
        sub = t.split(colors, list(range(world)), "even")
        if me % 2 == 0:
            check_transport(sub, "even")
            inner = sub.split([0] * sub.size, [sub.size - 1 - k for k in range(sub.size)], "even/rev")
            check_transport(inner, "even/rev")
        else:
            assert sub is None
    # the native communicator over it: counters follow the contract
    comm = _c10d.make_c10d_communicator()
    assert comm.backend == "c10d" and comm.size == world and comm.rank == me and comm.name == "world"
    assert comm.counters() == {"bytes_sent": 0, "bytes_recv": 0, "collectives": 0}


def case_timeout() -> None:
    """Rank 1 never steps; the others' step raises MeshmuonError naming the op, within the timeout."""
    limit = float(os.environ["MESHMUON_TIMEOUT_S"])
    model = nn.Sequential(nn.Linear(32, 32, bias=False), nn.Linear(32, 16, bias=False))
    opt = dt.Muon(model.parameters(), lr=0.02)
    assert opt.engine == "distributed" and _comms._HOST_COMM.backend == "c10d"
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # a normal step first
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(limit + 4)  # never calls the step; exits after the others have given up
        os._exit(0)
    t0 = time.time()
    try:
        opt.step()
    except meshmuon.MeshmuonError as e:
        took = time.time() - t0
        msg = str(e)
        print(f"TIMEOUT rank {dist.get_rank()} after {took:.1f} s: {msg}", flush=True)
        assert "[c10d]" in msg and "timed out" in msg and f"rank {dist.get_rank()}:" in msg, msg
        assert any(f"{op} '" in msg for op in ("all_reduce", "all_gather", "all_to_all", "group",
                                               "reduce_scatter", "broadcast")), msg
        assert took < limit + 5, took
        # communication is unusable afterwards: the next step refuses to post
        try:
            opt.step()
        except meshmuon.MeshmuonError as e2:
            assert "unusable" in str(e2), str(e2)
        else:
            raise AssertionError("a step after the timeout was accepted")
        print(f"CASE timeout OK rank {dist.get_rank()}", flush=True)
        sys.stdout.flush()
        os._exit(0)  # no clean shutdown: an op stays posted
    raise AssertionError("the step did not time out")


def case_bytes() -> None:
    """Under mpirun: MPI and c10d communicators in one job, the same steps, same bytes, same bits."""
    world = dist.get_world_size()
    mpi, c10d = _core_comm("mpi"), _core_comm("c10d")
    assert (mpi.backend, c10d.backend) == ("mpi", "c10d")
    torch.manual_seed(7)
    base = nn.Sequential(nn.Linear(256, 256, bias=False), nn.Linear(256, 192, bias=False),
                         nn.Linear(192, 320, bias=False), nn.Linear(96, 64, bias=False))
    runs = {}
    for name, comm in (("mpi", mpi), ("c10d", c10d)):
        model = copy.deepcopy(base)
        _comms._HOST_COMM = comm  # the engine takes the job's communicator from here
        opt = dt.Muon(dt.param_groups(model, muon=dict(lr=0.02, normuon=True)), lr=0.02)
        assert opt._engine.comm.backend == name
        stats = []
        for s in range(3):
            g = torch.Generator().manual_seed(100 + s)
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
            stats.append(opt.last_step_stats)
        runs[name] = (model, stats, comm.counters())
    keys = ("bytes_sent", "bytes_recv", "bytes_sent_predicted", "bytes_recv_predicted", "collectives")
    for s in range(3):
        a = {k: runs["mpi"][1][s][k] for k in keys}
        b = {k: runs["c10d"][1][s][k] for k in keys}
        assert a == b, (s, a, b)
        assert a["bytes_sent"] == a["bytes_sent_predicted"] and a["bytes_sent"] > 0, a
    assert runs["mpi"][2] == runs["c10d"][2], (runs["mpi"][2], runs["c10d"][2])
    for (n, p), (_, q) in zip(runs["mpi"][0].named_parameters(), runs["c10d"][0].named_parameters()):
        assert torch.equal(p.detach().view(torch.int32), q.detach().view(torch.int32)), n
    say(f"  bytes per step (rank 0): {runs['c10d'][1][-1]['bytes_sent']} sent, "
        f"{runs['c10d'][1][-1]['bytes_recv']} received, on {world} ranks")
    _comms._HOST_COMM = c10d


def case_hold() -> None:
    """A daemon thread keeps an optimizer (engine + communicator) alive past the end of the script:
    meshmuon's exit hook must still release the native objects in order, so that nanobind reports no
    leaked Optimizer / Communicator. MESHMUON_TEST_NO_SHUTDOWN=1 removes the hook (negative control)."""
    import atexit
    import threading
    if os.environ.get("MESHMUON_TEST_NO_SHUTDOWN") == "1":
        atexit.unregister(_comms.shutdown)
    model = nn.Linear(16, 16, bias=False)
    opt = dt.Muon(model.parameters(), lr=0.02)
    model.weight.grad = torch.ones_like(model.weight)
    opt.step()
    assert opt.engine == "distributed"
    threading.Thread(target=lambda o=opt: time.sleep(600), daemon=True).start()


def case_nccl_bootstrap() -> None:
    from meshmuon import _core
    if torch.cuda.is_available():
        say("SKIP nccl_bootstrap: a GPU is present (this case checks the no-device path)")
        return
    calls = []
    real = _comms.torch_exchange

    def counting(blob: bytes, index: int = 0) -> bytes:
        calls.append(len(blob))
        out = real(blob, index)
        assert len(out) == len(blob) * dist.get_world_size(), (len(out), len(blob))
        return out

    _comms.torch_exchange = counting
    try:
        try:
            _comms.communicator(dist.get_world_size(), "cuda:0")
        except _core.MeshmuonError as e:
            msg = str(e)
        else:
            raise AssertionError("the nccl communicator came up without a GPU")
    finally:
        _comms.torch_exchange = real
    if _core.nccl_available():
        assert msg.startswith(f"[nccl] rank {dist.get_rank()}: no CUDA device: "), msg
        assert calls == [512], calls  # the failing rank still joined the exchange
    else:
        assert msg.startswith("[nccl] meshmuon was built without"), msg
    assert "cuda:0" not in _comms._DEVICE_COMMS


def _core_comm(kind: str):
    return _comms.make_communicator(kind)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    args = ap.parse_args()
    dt.init_distributed(master_port=int(os.environ.get("MASTER_PORT", "29512")))
    meshmuon.blas_set_num_threads(1)
    run_cases({"transport": case_transport, "timeout": case_timeout, "bytes": case_bytes,
               "hold": case_hold, "nccl_bootstrap": case_nccl_bootstrap}, args.cases)


if __name__ == "__main__":
    guarded(main)
