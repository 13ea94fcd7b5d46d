"""This machine's own step-time figures, fitted by `mpskit calibrate` (trials/calibrate.py) and kept in
the user's cache, so that a detected machine plans its durations with figures measured on it.

The figures are kept with the machine they were measured on (its processor and core count): a cache
copied to another machine, or a virtual machine moved to another processor, is not taken for it. No
torch import: `mpskit plan` reads the file.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.files import write_atomic

CALIBRATION_FILE = "~/.cache/mpskit/calibration.json"
CALIBRATION_VARIABLE = "MPSKIT_CALIBRATION_FILE"  # another file (a shared home, the tests: none)


def calibration_file() -> Path:
    return Path(os.environ.get(CALIBRATION_VARIABLE) or CALIBRATION_FILE).expanduser()


def machine_key(kind: str, chip: str) -> str:
    """What the figures belong to: the kind of machine, its processor (hardware.detect's chip), its cores."""
    return f"{kind}: {chip}, {os.cpu_count()} cores"


def saved_figures(kind: str, chip: str) -> dict | None:
    """The throughput figures `mpskit calibrate` kept for this machine, or None (none kept, or another
    machine's)."""
    path = calibration_file()
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        machine, figures = data["machine"], data["throughput"]
    except (OSError, ValueError, KeyError, TypeError):
        raise MpskitError(f"{path} is not a calibration mpskit wrote",
                          f"remove {path}; `mpskit calibrate` writes it again") from None  # fmt: skip
    return figures if machine == machine_key(kind, chip) else None


def save_figures(kind: str, chip: str, figures: dict, steps: list[dict]) -> Path:
    """Keep FIGURES for this machine (the previous calibration's are replaced), with the STEPS they were
    fitted to; written whole or not at all."""
    path = calibration_file()
    record = {"machine": machine_key(kind, chip), "measured_on": time.strftime("%Y-%m-%d"), "throughput": figures,
              "steps": steps}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=2) + "\n")
    return path
