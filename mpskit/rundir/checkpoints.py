"""A run's checkpoint-N folders: which there are, the step each saved, whether its save finished,
and the newest a run can resume from (a newer, incomplete one is set aside, never deleted). No torch
import (safetensors reads a weights file's header).
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

from mpskit.files import set_aside

WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "adapter_model.bin", "pytorch_model.bin",
                "model.safetensors.index.json")  # fmt: skip


def checkpoints(run_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first."""
    steps = [(int(m[1]), p) for p in run_dir.glob("checkpoint-*") if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return [path for _, path in sorted(steps)]


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step a complete checkpoint saved (its trainer_state.json's global_step)."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    step = state.get("global_step") if isinstance(state, dict) else None
    return step if isinstance(step, int) else None


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None. transformers writes trainer_state.json after
    the weights and the optimizer, so a readable one means the save finished."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable trainer_state.json (killed while saving?)"
    weights = [checkpoint / name for name in WEIGHT_FILES if (checkpoint / name).is_file()]
    if not weights:
        return "no weights"
    if weights[0].suffix == ".safetensors" and not _safetensors_whole(weights[0]):
        return f"{weights[0].name} is cut short"
    if (checkpoint / "latest").is_file():  # DeepSpeed's: the optimizer's states split by rank
        why = _deepspeed_states_reason(checkpoint)
        if why:
            return why
    elif not any(_torch_file(checkpoint / name) for name in ("optimizer.pt", "optimizer.bin")):  # .bin: FSDP's
        return "no readable optimizer.pt"
    return None if _torch_file(checkpoint / "scheduler.pt") else "no readable scheduler.pt"


def _deepspeed_states_reason(checkpoint: Path) -> str | None:
    """Why DeepSpeed's part of a checkpoint cannot be resumed from: the folder its `latest` file names
    holds each rank's optimizer states, and the model's (each rank's under ZeRO-3, one file else), for
    as many ranks as the trainer saved rng_state_N.pth files."""
    tag = (checkpoint / "latest").read_text(encoding="utf-8").strip()
    folder = checkpoint / tag
    for rank in range(len(list(checkpoint.glob("rng_state_*.pth"))) or 1):
        optimizer = sorted(folder.glob(f"*zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"))
        model = sorted(folder.glob(f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")) or sorted(
            folder.glob("mp_rank_00_model_states.pt"))  # fmt: skip
        for part, found in (("optimizer", optimizer), ("model", model)):
            if not (found and _torch_file(found[0])):
                return f"no readable {part} states of rank {rank} in {tag}/"
    return None


def _torch_file(path: Path) -> bool:
    """What torch.save writes: a zip archive (its index is at the end, so a cut-short file has none)
    holding <name>/data.pkl."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _safetensors_whole(path: Path) -> bool:
    """safetensors reads the file: its header, and tensors that the file covers (one cut short is
    "incomplete metadata")."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="numpy"):
            return True
    except (SafetensorError, OSError, ValueError):
        return False


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint a run can resume from. Newer, incomplete ones are set aside."""
    for checkpoint in reversed(checkpoints(run_dir)):
        why = incomplete_reason(checkpoint)
        if why is None:
            return checkpoint
        aside = set_aside(checkpoint, "incomplete")
        print(f"mpskit: skipped {checkpoint.name}: {why}; kept as {aside.name}", file=sys.stderr)
    return None
