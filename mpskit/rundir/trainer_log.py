"""LLaMA-Factory's trainer_log.jsonl in a run folder: its entries read and checked, and mended before
a resume (a last line cut short by a kill; the steps the resume logs again set aside). No torch import.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.files import write_atomic
from mpskit.rundir.record import is_of

LOG = "trainer_log.jsonl"


def read_log(run_dir: Path) -> list[dict]:
    """Every entry of trainer_log.jsonl (none before the first logged step). A last line cut short (a
    kill while LLaMA-Factory appended it) is left out; any other line that is not an entry is one line."""
    path = run_dir / LOG
    if not path.is_file():
        return []
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise MpskitError(f"{path} is not readable ({type(err).__name__})", "restore it or move it away") from None
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        if not isinstance(entry, dict):
            if number == len(lines):
                break  # cut short as it was written
            raise MpskitError(f"{path}: line {number} is not a log entry", "restore the file or delete that line")
        if wrong := next((key for key, value in entry.items() if not is_of(value, _log_type(key))), None):
            raise MpskitError(f"{path}: line {number}: {wrong} is {json.dumps(entry[wrong])[:40]}, not a number",
                              "restore the file or delete that line")  # fmt: skip
        entries.append(entry)
    return entries


# What LLaMA-Factory logs: numbers (loss, lr, steps, rewards/...), times as text ("0:01:02"), null;
# the figures mpskit reads are numbers.
LOG_NUMBERS = ("current_steps", "total_steps", "loss", "eval_loss", "lr", "epoch", "percentage")


def _log_type(key: str) -> object:
    return float | None if key in LOG_NUMBERS or key.startswith(("rewards/", "eval_")) else float | str | None


SUPERSEDED = "trainer_log.superseded.jsonl"  # the entries of steps a resume trains again, kept


def mend(run_dir: Path, from_step: int) -> None:
    """Before a resume from step FROM_STEP (0: no checkpoint, trained again from the start): a last line
    cut short (a kill mid-append) is dropped, so that LLaMA-Factory's next entry starts a line of its
    own; the entries of the steps after FROM_STEP, which the resume logs again, move to SUPERSEDED
    beside it (a second step-1 entry otherwise)."""
    path = run_dir / LOG
    with contextlib.suppress(FileNotFoundError), open(path, "rb+") as file:
        text = file.read()
        whole = text.rfind(b"\n") + 1
        if whole < len(text):
            file.truncate(whole)
            print(f"mpskit: {path} ended in a line cut short ({len(text) - whole} bytes, written as the run "
                  "was killed); it now ends at its last whole entry", file=sys.stderr)  # fmt: skip
    kept, again = [], []
    for entry in read_log(run_dir):
        (kept if from_step and entry.get("current_steps", 0) <= from_step else again).append(entry)
    if again:
        with open(run_dir / SUPERSEDED, "a", encoding="utf-8") as superseded:
            superseded.writelines(json.dumps(entry) + "\n" for entry in again)
        write_atomic(path, "".join(json.dumps(entry) + "\n" for entry in kept))
