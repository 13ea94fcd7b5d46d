"""A folder a command fills for the user (export -o, tiny-model, get-model): absent or an empty folder of
the user's before, a complete model after, nothing that looks like one in between. No torch import.

The folder is written under a hidden name, `.NAME.partial-PID-RANDOM`, on OUT's own file system (inside
OUT when OUT is the user's empty folder, which may be a mount point; beside it otherwise), and moved
into place when complete. This process makes that folder itself (mkdir fails on anything already
there, a planted link included) and marks it with its process number and start time. Only the folder
it made is moved, checked by its inode first. Any other end (an error, Ctrl-C, SIGTERM) removes it; a
SIGKILL cannot, so the next writer of OUT removes a marked leftover whose process is gone, and says so.
A folder with such a name and no mark is the user's: it is named, never touched.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from mpskit.errors import MpskitError
from mpskit.files import cannot_write, disk_full, writing
from mpskit.lock_files import read_note

MARK = ".mpskit-partial"  # inside a partial folder: {"pid": ..., "started": ...} of the process that made it


def fill(out: Path, what: str, doing: str, fix: str, make: Callable[[Path], None]) -> Path:
    """MAKE(folder) writes the folder's files into an empty folder made here; one writer at a time
    (files.writing)."""
    with writing(out, what, doing):
        clear_leftovers(out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise MpskitError(f"{out} already exists and is not an empty folder", fix)
        partial, made = None, None
        try:
            partial, made = make_partial(out if out.is_dir() else out.parent, out.name)
            make(partial)
            move_into_place(partial, out, made)
        except Exception as err:
            if isinstance(err, OSError) and err.filename and not str(err.filename).startswith(str(partial)):
                raise  # a file it read
            if isinstance(err, OSError) or disk_full(err):  # safetensors' own error for a full disk, too
                raise cannot_write(out, err if isinstance(err, OSError) else OSError(errno.ENOSPC, ""), what) from None
            raise
        finally:
            if partial and _is_made(partial, made):
                shutil.rmtree(partial, ignore_errors=True)  # this process's own half-written folder
    return out


def make_partial(folder: Path, name: str) -> tuple[Path, os.stat_result]:
    """A new hidden folder in FOLDER made by this process (mkdir: never through anything already
    there), with its mark inside: (the folder, its lstat)."""
    while True:
        partial = folder / f".{name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            partial.mkdir()
            break
        except FileExistsError:
            continue
    made = os.lstat(partial)
    fd = os.open(partial / MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as file:
        json.dump({"pid": os.getpid(), "started": psutil.Process().create_time()}, file)
    return partial, made


def clear_leftovers(out: Path) -> None:
    """The half-written folders of OUT's writers that were killed: marked by a process that is gone.
    A folder with that name but no mark of mpskit's is named and left alone."""
    for folder in dict.fromkeys((out, out.parent)):
        if folder.is_symlink() or not folder.is_dir():
            continue
        unmarked = []
        for path in sorted(map(Path, glob.glob(glob.escape(str(folder / f".{out.name}.partial-")) + "*"))):
            writer = _writer(path)
            if writer is None:
                unmarked.append(path)
            elif not _alive(*writer):
                shutil.rmtree(path)
                print(f"mpskit: removed {path}, left by a writer of {out.name} that was killed", file=sys.stderr)
        if unmarked:
            more = f" and {len(unmarked) - 1} more like it" if len(unmarked) > 1 else ""
            print(f"mpskit: left {unmarked[0]}{more} alone: mpskit did not mark it as its own half-written folder; "
                  "move it away if you do not need it", file=sys.stderr)  # fmt: skip


def _writer(path: Path) -> tuple[int, float] | None:
    """(pid, start time) in PATH's mark; None when PATH is not a real folder holding a regular mark file
    (lock_files.read_note reads it without following a link or blocking on a FIFO)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        mark = json.loads(read_note(path / MARK) or "null")
        return int(mark["pid"]), float(mark["started"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _alive(pid: int, started: float) -> bool:
    """Whether process PID is the one that started at STARTED (a number the system gave again is not)."""
    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except psutil.Error:
        return False


def _is_made(path: Path, made: os.stat_result | None) -> bool:
    """Whether PATH is still the folder this process made (not a link or another folder put there)."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return made is not None and stat.S_ISDIR(now.st_mode) and (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino)


def move_into_place(partial: Path, out: Path, made: os.stat_result) -> None:
    """PARTIAL's files become OUT's, by renames on one file system: PARTIAL itself onto a missing OUT;
    into OUT, config.json last (what makes a folder a model), when PARTIAL lies inside it. Only the
    folder this process made (MADE) moves. Another writer that got there first is one line."""
    taken = MpskitError(f"{out} was written by another process meanwhile", "give -o a new folder")
    if not _is_made(partial, made):
        raise MpskitError(f"{partial} was replaced while mpskit wrote it", "give -o a folder only you can write")
    os.unlink(partial / MARK)
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
