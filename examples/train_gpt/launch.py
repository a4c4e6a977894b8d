"""Process setup for the demo: relaunch under torchrun (the default; meshmuon's engine then runs on
the job's torch.distributed process group through its c10d communicator) or mpirun (meshmuon's MPI
communicator) when started as a plain `python train.py`, and initialise the torch process group
(gloo, CPU) from the launcher's environment inside each rank."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import torch
import torch.distributed as dist


def under_launcher() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "WORLD_SIZE" in os.environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCHERS = ("torchrun", "mpirun")


def relaunch(launcher: str, ranks: int, argv: list[str]) -> int:
    """Runs this script under `launcher` ("torchrun" or "mpirun") with `ranks` processes."""
    if launcher == "torchrun":
        return relaunch_under_torchrun(ranks, argv)
    if launcher == "mpirun":
        return relaunch_under_mpirun(ranks, argv)
    raise ValueError(f"[demo] unknown launcher '{launcher}'; choose one of {', '.join(LAUNCHERS)}")


def relaunch_under_torchrun(ranks: int, argv: list[str]) -> int:
    """Runs `python -m torch.distributed.run --standalone --nproc-per-node ranks <this script>
    argv` and returns its exit code: a one-machine job with a free rendezvous port of its own (so
    concurrent demos do not collide), ranks' output unbuffered. No MPI involved: meshmuon's engine uses
    the c10d communicator over torch's process group."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, set here to keep its notice quiet
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           os.path.abspath(sys.argv[0]), *argv]
    return subprocess.call(cmd, env=env)


def relaunch_under_mpirun(ranks: int, argv: list[str]) -> int:
    """Runs `mpirun -np ranks python <this script> argv` and returns its exit code. Oversubscribes
    (more ranks than cores is the default here), does not bind ranks to cores, allows root, and
    gives the ranks a free MASTER_PORT so concurrent demos do not collide."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("[demo] mpirun not found; install Open MPI (make setup does) or run one process "
              "with --ranks 1 --no-launch", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("MASTER_PORT", str(free_port()))
    cmd = [mpirun, "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
           "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PYTHONPATH",
           sys.executable, "-u", os.path.abspath(sys.argv[0]), *argv]
    env.setdefault("PYTHONPATH", "")
    return subprocess.call(cmd, env=env)


def init_process_group(expected_ranks: int) -> tuple[int, int]:
    """Maps OMPI_COMM_WORLD_RANK / SIZE / LOCAL_RANK to RANK / WORLD_SIZE / LOCAL_RANK (kept when
    already set, e.g. by torchrun), starts gloo, and gives each rank its share of the cores
    (one thread when oversubscribed). Returns (rank, world)."""
    for ompi, torch_name in (("OMPI_COMM_WORLD_RANK", "RANK"), ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"),
                             ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK")):
        if ompi in os.environ:
            os.environ.setdefault(torch_name, os.environ[ompi])
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != expected_ranks:
        raise ValueError(f"[demo] started with {world} ranks but --ranks is {expected_ranks}; "
                         f"give mpirun -np {expected_ranks} or change --ranks")
    cores = os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return rank, world
