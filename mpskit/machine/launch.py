"""Several processes: one per GPU (or as NPROC_PER_NODE / NNODES say), through torchrun.

LLaMA-Factory's own launcher starts its own entry point; mpskit starts `mpskit rank RUN_DIR` on every
rank instead, so each process has the fooDPO stage and mpskit's callbacks. The variables are
LLaMA-Factory's: NPROC_PER_NODE, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT. No torch import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from mpskit.errors import MpskitError
from mpskit.machine.hardware import Hardware
from mpskit.self_command import mpskit_command

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # those run/signals.py stops a training on
# DeepSpeed's CPU all-reduce buffer of one rank (deepspeed/ops/csrc/cpu/comm/shm.cpp): uid, address, port, rank
SHARED_BUFFER = "/dev/shm/deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"


def _env_count(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit() or int(text) < 1:
        raise MpskitError(f"{name}={text!r} is not a positive whole number", f"set {name} to 1, 2, ...")
    return int(text)


def process_layout(hw: Hardware) -> tuple[int, int]:
    """(processes per node, nodes): NPROC_PER_NODE, else one per GPU of a CUDA profile; NNODES, else 1."""
    gpus = hw.gpu_count if hw.kind == "cuda" and hw.gpu_count > 1 else 1
    return _env_count("NPROC_PER_NODE", gpus), _env_count("NNODES", 1)


def check_rendezvous(nnodes: int) -> None:
    """Several nodes meet at one address and port, which each of them must be given: without them every
    node would take its own address and a random port of its own, and wait for the others forever."""
    node_suffix(nnodes)
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if nnodes > 1 and missing:
        raise MpskitError(
            f"NNODES={nnodes} without {' and '.join(missing)}: each node would wait for the others at an address "
            "and port of its own",
            "set MASTER_ADDR to node 0's address and MASTER_PORT to a free port there, the same on every node",
        )


def node_suffix(nnodes: int) -> str:
    """What this node's run folder name ends with among several nodes ("-node1"): nothing on one node."""
    if nnodes == 1:
        return ""
    text = os.environ.get("NODE_RANK") or "0"
    if not text.isdigit() or int(text) >= nnodes:
        raise MpskitError(f"NODE_RANK={text!r} is not a node of NNODES={nnodes} (0 to {nnodes - 1})",
                          "set NODE_RANK to this node's number: 0 on the node at MASTER_ADDR")  # fmt: skip
    return f"-node{int(text)}"


def launched(processes: tuple[int, int], args: dict) -> bool:
    """Whether the run starts its processes through torchrun: several of them, or one under DeepSpeed or
    FSDP, which accelerate starts only in a process group (LLaMA-Factory's FORCE_TORCHRUN=1)."""
    return processes != (1, 1) or bool(args.get("deepspeed") or args.get("fsdp"))


def inside_launch() -> bool:
    """True in a process torchrun started (it sets these for every rank)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def meeting_point() -> tuple[str, str]:
    """The address and port the ranks meet at: MASTER_ADDR and MASTER_PORT, else this machine and a free port."""
    return os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT") or str(_free_port())


def torchrun_command(run_dir: Path, nproc: int, nnodes: int, addr: str, port: str) -> list[str]:
    """torchrun, starting `mpskit rank RUN_DIR` on every rank as self_command starts mpskit: with `-P`
    and this process's import path, so a user's `datasets.py` in the working folder shadows nothing."""
    return [
        sys.executable, "-P", "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--node_rank", os.environ.get("NODE_RANK") or "0",
        "--nproc_per_node", str(nproc),
        "--master_addr", addr,
        "--master_port", port,
        "--no-python", *mpskit_command("rank", str(run_dir)),
    ]  # fmt: skip


def rank_environment(device: str, nproc: int) -> dict[str, str]:
    """What the ranks add to this environment. On the CPU they see no GPU, DeepSpeed takes the CPU as its
    accelerator and this node's processes as its devices (without LOCAL_SIZE it counts NUMA nodes), and
    each rank takes its share of the cores (torchrun gives each one thread, where OMP_NUM_THREADS is unset)."""
    if device != "cpu":
        return {}
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // nproc))
    return {"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu", "LOCAL_SIZE": str(nproc), "OMP_NUM_THREADS": threads}


def launch(run_dir: Path, nproc: int, nnodes: int, device: str) -> int:
    """torchrun's exit code, once every rank of this node has ended. torchrun runs in a session of its
    own, so a Ctrl-C, a closed terminal or a SIGTERM reaches this process alone, which hands each one to
    the ranks: torchrun would send them a second signal of its own (a stop at once, mid-checkpoint) and
    SIGKILL 30 s later, however long their checkpoint takes."""
    check_rendezvous(nnodes)
    addr, port = meeting_point()
    command = torchrun_command(run_dir, nproc, nnodes, addr, port)
    count = nproc * nnodes
    shown = [*command[3 : command.index("--no-python")], "mpskit", "rank", str(run_dir)]
    print(f"mpskit: {count} process{'es' if count > 1 else ''}: {' '.join(shown)}", file=sys.stderr)
    env = {**os.environ, **rank_environment(device, nproc)}
    torchrun = subprocess.Popen(command, env=env, start_new_session=True)
    previous = {number: signal.signal(number, _to_ranks_of(torchrun.pid)) for number in STOP_SIGNALS}
    try:
        return torchrun.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if torchrun.poll() is not None and device == "cpu":
            release_shared_buffers(addr, port, nproc, ended=time.time())


def release_shared_buffers(addr: str, port: str, nproc: int, ended: float) -> None:
    """DeepSpeed's CPU all-reduce gives each rank a 66 MB buffer in /dev/shm (RAM) and never unlinks it:
    every run on CPU processes would keep its ranks' buffers until the machine restarts. (It runs where
    LOCAL_SIZE counts every rank, as rank_environment sets it.) Once torchrun has ended, this run's go.
    A buffer made after ENDED is another run's, on the same port since: it stays."""
    for number in range(nproc):
        buffer = Path(SHARED_BUFFER.format(uid=os.getuid(), addr=addr, port=port, rank=number))
        with contextlib.suppress(FileNotFoundError):
            if buffer.stat().st_mtime <= ended:
                buffer.unlink()


def _to_ranks_of(torchrun_pid: int):
    def hand_over(number, frame) -> None:
        for process in psutil.Process(torchrun_pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(number)

    return hand_over
