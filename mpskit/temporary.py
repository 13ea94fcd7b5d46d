"""Temporary folders: private and unpredictable (`tempfile.mkdtemp`: mode 0700, a random name created
exclusively, so no one can plant a link there first), and removed when the process exits. No torch
import.

A plain SIGTERM ends Python without unwinding, so `exit_on_sigterm` (installed by the command line for
the whole command) turns it into an exit that runs the removal; a training attempt's own signal guard
takes SIGTERM over while it trains and hands it back after.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import tempfile
from pathlib import Path
from typing import NoReturn

from mpskit.errors import SignalExit


def private_folder(prefix: str, keep: bool = False) -> Path:
    """A new folder only this user can enter; removed at exit unless KEEP (what a command hands on)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if not keep:
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


_RECEIVED: list[int] = []  # each signal exit_on_sigterm raised, kept in case a library swallowed the exit


def exit_on_sigterm(signum: int, frame: object) -> NoReturn:
    """SIGTERM as an exit that unwinds: `finally` blocks and the removals above run, children are killed."""
    _RECEIVED.append(signum)
    raise SignalExit(signum)


def exit_if_signalled() -> None:
    """The exit of a SIGTERM or SIGHUP again, where a library's bare `except:` swallowed it (imports
    have them: `try: import x` / `except:`). Call where no library's code is on the stack."""
    if _RECEIVED:
        raise SignalExit(_RECEIVED[0])


def install_sigterm_exit() -> None:
    """SIGTERM and SIGHUP (the terminal closed) alike."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    signal.signal(signal.SIGHUP, exit_on_sigterm)
