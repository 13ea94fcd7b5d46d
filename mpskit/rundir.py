"""A run folder and what mpskit keeps in it: the run record (mpskit.json), LLaMA-Factory's
trainer_log.jsonl, its checkpoints, and the `latest` link beside it. No torch import.

Every module that reads or writes these goes through here, so the record's fields are written down
once, as `RunRecord`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mpskit.errors import MpskitError

RECORD = "mpskit.json"
YAML = "llamafactory.yaml"
LOG = "trainer_log.jsonl"


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
    ladder: dict = field(default_factory=dict)  # free knobs and cutoff floor of the out-of-memory ladder
    processes: list[int] = field(default_factory=lambda: [1, 1])  # per node, nodes
    command: list[str] = field(default_factory=list)
    started: str = ""
    versions: dict = field(default_factory=dict)
    attempts: list[dict] = field(default_factory=list)  # knobs, resumed_from, outcome, measured, lean_logits


def write_record(run_dir: Path, record: RunRecord) -> None:
    text = json.dumps(dataclasses.asdict(record), indent=2, default=str) + "\n"
    (run_dir / RECORD).write_text(text, encoding="utf-8")


def read_record(run_dir: Path) -> RunRecord:
    data = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
    known = {f.name for f in dataclasses.fields(RunRecord)}
    return RunRecord(**{key: value for key, value in data.items() if key in known})


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


def last_checkpoint(run_dir: Path) -> Path | None:
    steps = [(int(m[1]), p) for p in run_dir.glob("checkpoint-*") if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return max(steps)[1] if steps else None


def point_latest(run_dir: Path) -> None:
    """output/<run>/latest -> this run folder, unless something else the user made is there."""
    latest = run_dir.parent / "latest"
    if latest.is_symlink() or not latest.exists():
        if latest.is_symlink():
            latest.unlink()
        latest.symlink_to(run_dir.name)


def latest_run_dir(root: str | Path = "output") -> Path:
    """The newest run folder that some output/<run>/latest points at."""
    runs = [link.resolve() for link in Path(root).glob("*/latest") if link.is_symlink() and link.resolve().is_dir()]
    if not runs:
        raise MpskitError(f"no run found under {root}/", "give the run directory: mpskit train --resume RUN_DIR")
    return max(runs, key=lambda path: (path / RECORD).stat().st_mtime if (path / RECORD).exists() else 0)
