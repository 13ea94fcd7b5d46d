"""The small files that say which process holds a lock: `.mpskit.lock` in a run folder (a note beside the
lock on the folder itself, hold_folder) and `.NAME.lock` beside an output path (the lock file itself,
take_lock_file). No torch import.

A name in a folder may be anything a user, a copy or an archive put there: a link, a hard link to a
run's adapter, a FIFO, the user's own file. So mpskit writes only a file it created itself (opened with
O_EXCL), replaces a stale one only when it is a regular file with one name that holds a note of its own
kind (or nothing: a writer killed before it wrote), never blocks on an open (O_NONBLOCK: a FIFO), and
refuses anything else in one line that names the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from mpskit.errors import MpskitError

NOTE = re.compile(r"process \d+ \([^\n]*\)")  # what note_text writes
NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
EXISTING = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)  # the folder takes no note


def note_text(doing: str) -> bytes:
    return f"process {os.getpid()} ({doing})".encode()


def read_note(path: Path) -> str:
    """The holder a note names; "" for anything that is not a regular file (read without blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        return os.read(fd, 200).decode(errors="replace").strip() if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    finally:
        os.close(fd)


def foreign(path: Path, info: os.stat_result | None = None) -> str | None:
    """What PATH is when it is not a note mpskit may take over (None: absent, or a note of its own)."""
    try:
        info = info or os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return "a link"
    if stat.S_ISDIR(info.st_mode):
        return "a folder"
    if stat.S_ISFIFO(info.st_mode):
        return "a FIFO"
    if not stat.S_ISREG(info.st_mode):
        return "a special file"
    if info.st_nlink > 1:
        return f"a hard link (the file has {info.st_nlink} names)"
    text = read_note(path)
    return None if not text or NOTE.fullmatch(text) else "a file that is not mpskit's"


def refused(path: Path, what: str) -> MpskitError:
    return MpskitError(f"{path} is {what}, not mpskit's lock file", f"move {path} away, then run this again")


def take_lock_file(path: Path, doing: str) -> tuple[int, str | None]:
    """An exclusive lock on the lock file PATH, created here or taken over from a killed holder, with
    this process's note in it: (its descriptor, None); or (-1, the note of the live holder)."""
    while True:
        try:
            fd = os.open(path, NEW, 0o644)
        except FileExistsError:
            try:
                fd = os.open(path, EXISTING)
            except FileNotFoundError:  # its holder ended meanwhile
                continue
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise refused(path, foreign(path) or "not a regular file") from None
                raise
            what = foreign(path, os.fstat(fd))
            if what:
                os.close(fd)
                raise refused(path, what) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_note(path) or "another process"
            os.close(fd)
            return -1, holder
        if not _same_file(fd, path):  # a lock file its last holder removed while this one waited to open it
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, note_text(doing))
        return fd, None


def leave_note(path: Path, doing: str) -> int | None:
    """A note at PATH naming this process (the holder of a lock taken elsewhere, so any note already
    there is stale); None where the folder cannot take one (read-only)."""
    while True:
        try:
            fd = os.open(path, NEW, 0o644)
        except FileExistsError:
            what = foreign(path)
            if what:
                raise refused(path, what) from None
            path.unlink(missing_ok=True)
            continue
        except OSError as err:
            if err.errno in UNWRITABLE:
                return None
            raise
        try:
            os.write(fd, note_text(doing))
        except OSError as err:  # a full disk: locked all the same, without the note
            remove_own(fd, path)
            if err.errno not in UNWRITABLE:
                raise
            return None
        return fd


def _lock_folder(folder: Path) -> int | None:
    """A descriptor of FOLDER holding its exclusive lock, or None while another process holds it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def holder_of(folder: Path, note: Path) -> str | None:
    """Who holds FOLDER's lock now (hold_folder), from its NOTE; None when no one does."""
    fd = _lock_folder(folder)
    if fd is None:
        return read_note(note) or "another process"
    os.close(fd)  # closing it drops the lock taken here
    return None


@contextlib.contextmanager
def hold_folder(folder: Path, note: Path, doing: str) -> Iterator[None]:
    """One process at a time in FOLDER: an exclusive lock on the folder itself, which the kernel
    releases when the process ends, however it ends. A second process is told who holds it, from the
    NOTE the holder leaves while it works."""
    fd = _lock_folder(folder)
    if fd is None:
        holder = read_note(note) or "another process"
        fix = "wait until it ends (or stop it), then run this again"
        raise MpskitError(f"{folder} is in use by {holder}", fix)
    try:
        note_fd = leave_note(note, doing)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        remove_own(note_fd, note)
        os.close(fd)


def remove_own(fd: int | None, path: Path) -> None:
    """PATH goes only when it is still the file FD holds; FD is closed."""
    if fd is None or fd < 0:
        return
    with contextlib.suppress(OSError):
        if _same_file(fd, path):
            path.unlink()
    os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), path.lstat())
    except FileNotFoundError:
        return False
