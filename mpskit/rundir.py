"""A run folder and what mpskit keeps in it: the run record (mpskit.json), LLaMA-Factory's
trainer_log.jsonl, its checkpoints, and the `latest` link beside it. No torch import.

Every module that reads or writes these goes through here, so the record's fields are written down
once, as `RunRecord`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mpskit.errors import MpskitError

RECORD = "mpskit.json"
YAML = "llamafactory.yaml"
LOG = "trainer_log.jsonl"
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "adapter_model.bin", "pytorch_model.bin",
                "model.safetensors.index.json")  # fmt: skip


@dataclass
class RunRecord:
    """mpskit.json: what was asked and decided before the run, then one entry per attempt."""

    run_name: str
    stage: str
    device: str
    hardware: dict = field(default_factory=dict)  # the profile's fields
    layers: list[str] = field(default_factory=list)  # the preset files merged, in order
    environment: dict = field(default_factory=dict)  # MPS variables exported for the run
    mps_hidden: bool = False
    llamafactory_args: dict = field(default_factory=dict)  # the YAML's arguments plus lean_logits
    model_dims: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)  # predicted, budget, planner_changes; measured, error
    duration: dict = field(default_factory=dict)  # predicted (duration.RunDuration); measured_s, error
    ladder: dict = field(default_factory=dict)  # free knobs and cutoff floor of the out-of-memory ladder
    processes: list[int] = field(default_factory=lambda: [1, 1])  # per node, nodes
    keep_awake: bool = True  # macOS: caffeinate while the run trains
    command: list[str] = field(default_factory=list)
    started: str = ""
    versions: dict = field(default_factory=dict)
    attempts: list[dict] = field(default_factory=list)  # knobs, resumed_from, outcome, measured, lean_logits


def write_atomic(path: Path, text: str) -> None:
    """PATH holds its old text or the new one, never a part (a full disk, a kill): the text goes to a
    temporary file in the same folder, reaches the disk, then replaces PATH in one rename. A link at
    PATH is replaced, not written through."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_record(run_dir: Path, record: RunRecord) -> None:
    write_atomic(run_dir / RECORD, json.dumps(dataclasses.asdict(record), indent=2, default=str) + "\n")


def read_record(run_dir: Path) -> RunRecord:
    try:
        data = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
        known = {f.name for f in dataclasses.fields(RunRecord)}
        return RunRecord(**{key: value for key, value in data.items() if key in known})
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise MpskitError(
            f"{run_dir / RECORD} is not a readable run record ({type(err).__name__})",
            "give a run folder that mpskit train wrote",
        ) from err


def update_record(run_dir: Path, change: Callable[[RunRecord], None]) -> RunRecord:
    """Read mpskit.json, let `change` edit the record, write it back."""
    record = read_record(run_dir)
    change(record)
    write_record(run_dir, record)
    return record


def is_run_dir(run_dir: Path) -> bool:
    return (run_dir / RECORD).is_file() and (run_dir / YAML).is_file()


def read_log(run_dir: Path) -> list[dict]:
    """Every entry of trainer_log.jsonl (none before the first logged step)."""
    path = run_dir / LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def checkpoints(run_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first."""
    steps = [(int(m[1]), p) for p in run_dir.glob("checkpoint-*") if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return [path for _, path in sorted(steps)]


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
    for name in ("optimizer.pt", "scheduler.pt"):
        if not _torch_file(checkpoint / name):
            return f"no readable {name}"
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
    """The file is as long as its header says (8-byte length, JSON header, then the tensors)."""
    try:
        with path.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(length))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size >= 8 + length + end
    except (OSError, ValueError, KeyError, TypeError):
        return False


def set_aside(checkpoint: Path, label: str) -> Path:
    """Rename checkpoint-N to checkpoint-N.<label>: kept, but out of LLaMA-Factory's (and
    transformers') own search for the last checkpoint, which matches only checkpoint-N."""
    aside, tries = checkpoint.with_name(f"{checkpoint.name}.{label}"), 1
    while aside.exists():
        tries += 1
        aside = checkpoint.with_name(f"{checkpoint.name}.{label}-{tries}")
    checkpoint.rename(aside)
    return aside


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint a run can resume from. Newer, incomplete ones are set aside."""
    for checkpoint in reversed(checkpoints(run_dir)):
        why = incomplete_reason(checkpoint)
        if why is None:
            return checkpoint
        aside = set_aside(checkpoint, "incomplete")
        print(f"mpskit: skipped {checkpoint.name}: {why}; kept as {aside.name}", file=sys.stderr)
    return None


def point_latest(run_dir: Path, root: str | Path = "output") -> None:
    """output/<run>/latest -> this run folder, unless something else the user made is there. Only
    for a folder mpskit made under output/: never beside a user's own output_dir (a model folder...)."""
    if run_dir.resolve().parent.parent != Path(root).resolve():
        return
    latest = run_dir.parent / "latest"
    ours = latest.is_symlink() and "/" not in os.readlink(latest)  # mpskit links to a sibling folder
    if ours or not (latest.exists() or latest.is_symlink()):
        if ours:
            latest.unlink()
        latest.symlink_to(run_dir.name)


def latest_run_dir(root: str | Path = "output") -> Path:
    """The newest run folder that some output/<run>/latest points at."""
    runs = [link.resolve() for link in Path(root).glob("*/latest") if link.is_symlink() and link.resolve().is_dir()]
    if not runs:
        raise MpskitError(f"no run found under {root}/", "give the run directory, output/<run>/<timestamp>")
    return max(runs, key=lambda path: (path / RECORD).stat().st_mtime if (path / RECORD).exists() else 0)


def new_run_dir(run_name: str, output_dir: str | None, root: str | Path = "output") -> Path:
    """output/<run>/<timestamp>: a fresh directory; an explicit output_dir must be new or empty."""
    if output_dir:
        path = Path(str(output_dir)).expanduser()
        if path.is_symlink() and not path.exists():
            raise MpskitError(f"output_dir {path} is a link to nothing", "set output_dir to a folder, or fix the link")
        if path.exists() and not path.is_dir():
            raise MpskitError(f"output_dir {path} is a file", "set output_dir to a new folder")
        if path.exists() and any(path.iterdir()):
            raise MpskitError(
                f"output_dir {path} already holds files", "choose a new output_dir; mpskit never overwrites a run"
            )
        return path
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(root) / run_name / stamp
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / run_name / f"{stamp}-{suffix}"
    return path
