"""Several processes: one per GPU (or as NPROC_PER_NODE / NNODES say), through torchrun.

LLaMA-Factory's own launcher starts its own entry point; mpskit starts `mpskit rank RUN_DIR` on every
rank instead, so each process has the fooDPO stage and mpskit's callbacks. The variables are
LLaMA-Factory's: NPROC_PER_NODE, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT. No torch import.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.machine.hardware import Hardware


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


def inside_launch() -> bool:
    """True in a process torchrun started (it sets these for every rank)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(run_dir: Path, nproc: int, nnodes: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes),
        "--node_rank", os.environ.get("NODE_RANK", "0"),
        "--nproc_per_node", str(nproc),
        "--master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "--master_port", os.environ.get("MASTER_PORT") or str(_free_port()),
        "-m", "mpskit.cli", "rank", str(run_dir),
    ]  # fmt: skip


def launch(run_dir: Path, nproc: int, nnodes: int) -> int:
    command = torchrun_command(run_dir, nproc, nnodes)
    print(f"mpskit: {nproc * nnodes} processes: {' '.join(command[2:])}", file=sys.stderr)
    return subprocess.run(command, check=False).returncode
