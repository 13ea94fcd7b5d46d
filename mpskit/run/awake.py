"""Keep a Mac from idle-sleeping for exactly the life of a run, with macOS's own `caffeinate`.

`caffeinate -i -w PID` holds an idle-sleep assertion until process PID exits, so even a killed
mpskit releases it; mpskit also stops it when the run ends. The display may still sleep, and a
closed lid on battery still sleeps the Mac: caffeinate cannot change that. No torch.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


def on_macos() -> bool:
    return platform.system() == "Darwin"


@contextmanager
def kept_awake(wanted: bool = True) -> Iterator[subprocess.Popen | None]:
    """While the block runs, `caffeinate -i -w <this process>` on macOS (None elsewhere, when not
    wanted, or without caffeinate)."""
    if not (wanted and on_macos() and shutil.which("caffeinate")):
        yield None
        return
    caffeinate = subprocess.Popen(["caffeinate", "-i", "-w", str(os.getpid())], stdin=subprocess.DEVNULL)
    try:
        yield caffeinate
    finally:
        caffeinate.terminate()
        try:
            caffeinate.wait(timeout=5)
        except subprocess.TimeoutExpired:
            caffeinate.kill()
