"""The environment a training process runs in: MPS hidden from torch when a run trains on the CPU,
and a written run's own variables entered again (for --resume, chat, export, eval). Imports torch
only when hiding."""

from __future__ import annotations

import functools
import os

from mpskit.rundir.record import RunRecord


def hide_accelerators() -> None:
    """Make torch, transformers, accelerate and LLaMA-Factory see no MPS or CUDA device.

    They all ask `torch.backends.mps.is_available()` / `is_built()` at call time, so replacing those
    two functions before transformers or llamafactory are imported keeps the model, the batches and
    the optimizer state on the CPU. CUDA is hidden the usual way, before torch initialises it.
    """
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.backends.mps.is_available = _no_device
    torch.backends.mps.is_built = _no_device


@functools.lru_cache
def _no_device() -> bool:
    """Stands in for torch's own lru_cache'd checks (torch._dynamo reads their __wrapped__)."""
    return False


def enter_run_environment(record: RunRecord) -> None:
    """The environment a written run trained in, here: its MPS variables, and MPS hidden if it was."""
    os.environ.update(record.environment)
    if record.mps_hidden:
        hide_accelerators()
