"""A folder a command fills for the user (export -o, tiny-model, get-model): absent or an empty folder of
the user's before, a complete model after, nothing that looks like one in between. No torch import.

The folder is written under a hidden name, `.NAME.partial-PID`, on OUT's own file system (inside OUT
when OUT is the user's empty folder, which may be a mount point; beside it otherwise), and moved into
place when complete. Any other end (an error, Ctrl-C, SIGTERM) removes it; a SIGKILL cannot, so the next
writer of OUT removes the leftover of a process that is gone, and says so.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from mpskit.errors import MpskitError
from mpskit.files import cannot_write, writing


def fill(out: Path, what: str, doing: str, fix: str, make: Callable[[Path], None]) -> Path:
    """MAKE(folder) writes the folder's files (it creates the folder); one writer at a time (files.writing)."""
    with writing(out, what, doing):
        clear_leftovers(out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise MpskitError(f"{out} already exists and is not an empty folder", fix)
        partial = (out if out.is_dir() else out.parent) / f".{out.name}.partial-{os.getpid()}"
        try:
            make(partial)
            move_into_place(partial, out)
        except OSError as err:
            if err.filename and not str(err.filename).startswith(str(partial)):  # a file it read
                raise
            raise cannot_write(out, err, what) from None
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # this process's own half-written folder
    return out


def clear_leftovers(out: Path) -> None:
    """The half-written folders of OUT's writers that were killed (their process is gone)."""
    for folder in dict.fromkeys((out, out.parent)):
        if folder.is_symlink() or not folder.is_dir():
            continue
        for path in map(Path, glob.glob(glob.escape(str(folder / f".{out.name}.partial-")) + "*")):
            number = path.name.rsplit("-", 1)[1]
            if number.isdigit() and path.is_dir() and not path.is_symlink() and not psutil.pid_exists(int(number)):
                shutil.rmtree(path)
                print(f"mpskit: removed {path}, left by a writer of {out.name} that was killed", file=sys.stderr)


def move_into_place(partial: Path, out: Path) -> None:
    """PARTIAL's files become OUT's, by renames on one file system: PARTIAL itself onto a missing OUT;
    into OUT, config.json last (what makes a folder a model), when PARTIAL lies inside it. Another
    writer that got there first is one line."""
    taken = MpskitError(f"{out} was written by another process meanwhile", "give -o a new folder")
    if partial.parent != out:
        try:
            os.rename(partial, out)
        except OSError as err:  # a folder that another writer filled meanwhile
            raise taken from err
        return
    if any(path != partial for path in out.iterdir()):
        raise taken
    for path in sorted(partial.iterdir(), key=lambda path: path.name == "config.json"):
        os.rename(path, out / path.name)
    partial.rmdir()
