"""`mpskit ls`'s list of the runs under output/: each run folder, its stage and model, how its last
attempt ended, the step it reached and its last logged loss. Reads the records and logs only (no torch)."""

from __future__ import annotations

import os
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.rundir.folder import RunDir, is_run_dir


def run_lines(root: str | Path = "output") -> list[str]:
    """One line per run folder under ROOT (output/<run>/<time>), oldest first; a record that does
    not read is said on its line, not raised."""
    folders = sorted((path for path in Path(root).glob("*/*") if not path.is_symlink() and is_run_dir(path)),
                     key=lambda path: path.name)  # fmt: skip
    return [_line(folder) for folder in folders]


def _line(folder: Path) -> str:
    where = os.path.relpath(folder)
    try:
        run = RunDir.open(folder)
        log = run.log()
    except MpskitError as err:
        return f"  {where:44} {err.problem}"
    steps = next((entry for entry in reversed(log) if "current_steps" in entry), {})
    losses = [entry["loss"] for entry in log if isinstance(entry.get("loss"), int | float)]
    outcome = run.record.attempts[-1].outcome if run.record.attempts else "not started"
    reached = f"step {steps['current_steps']}/{steps.get('total_steps', '?')}" if steps else "no step logged"
    loss = f", loss {losses[-1]:.4f}" if losses else ""
    model = Path(str(run.record.llamafactory_args.get("model_name_or_path", "?"))).name
    return f"  {where:44} {run.record.stage:7} {model:16} {outcome.split(':')[0]:12} {reached}{loss}"
