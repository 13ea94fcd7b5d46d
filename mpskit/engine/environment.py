"""The environment a training process runs in: MPS hidden from torch when a run trains on the CPU,
and a written run's own variables entered again (for --resume, chat, export, eval). Imports torch
only when hiding."""

from __future__ import annotations

import os

from mpskit.engine.bends import hide_accelerators
from mpskit.rundir.record import RunRecord


def enter_run_environment(record: RunRecord) -> None:
    """The environment a written run trained in, here: its MPS variables, and MPS hidden if it was."""
    os.environ.update(record.environment)
    if record.mps_hidden:
        hide_accelerators()
