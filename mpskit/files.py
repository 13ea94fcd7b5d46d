"""The file-system steps every writer of mpskit shares (a run, config -o, export -o, eval, compare
--out, tiny-model): a write that is whole or absent, the checks of an output path before anything is
written there and their one-line errors, one writer at a time for an output path, a new folder made by
this process alone, renaming aside instead of deleting, and the guard against YAML that expands without
end, and a JSON file read once a command. No torch import.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from mpskit import lock_files
from mpskit.errors import MpskitError


def read_json(path: Path) -> object:
    """The JSON value in PATH, read once a command while the file stays as it was (its size and time):
    a model's config.json and a dataset_info.json have several readers. Each caller gets its own copy.
    Raises what reading and json.loads would (OSError, ValueError, RecursionError)."""
    status = path.stat()
    return copy.deepcopy(_parsed(str(path.resolve()), status.st_mtime_ns, status.st_size))


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> object:
    return json.loads(Path(path).read_text(encoding="utf-8"))


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


MIN_FREE_BYTES = 1024**2  # a folder with less free is full for every writer (config -o, eval, export...)
# What an error number means for a path about to be written, and the fix (WHAT: the option that named it).
WRITE_ERRORS = {
    errno.ENOSPC: ("its disk is full", "free some space, or give {what} a path on another disk"),
    errno.EDQUOT: ("its disk quota is used up", "free some space, or give {what} a path on another disk"),
    errno.EROFS: ("its file system is read-only", "give {what} a path on a disk you can write"),
    errno.EACCES: ("it is not writable for this user", "give {what} a path in a folder you can write"),
    errno.EPERM: ("it is not writable for this user", "give {what} a path in a folder you can write"),
    errno.ENAMETOOLONG: ("the name is longer than its file system takes", "give {what} a shorter name"),
    errno.ENOTDIR: ("a part of it is a file, not a folder", "give {what} a path in a folder"),
    errno.EISDIR: ("it is a folder", "give {what} a file name"),
}


def cannot_write(path: Path, err: OSError, what: str) -> MpskitError:
    """The one line for any writer whose write of PATH failed with ERR."""
    reason, fix = WRITE_ERRORS.get(err.errno, (err.strerror or type(err).__name__, "give {what} another path"))
    return MpskitError(f"cannot write {path}: {reason}", fix.format(what=what))


def disk_full(err: BaseException) -> bool:
    """ENOSPC as Python raises it, or as torch.save and safetensors report it in their own errors."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    text = str(err)
    return any(sign in text for sign in ("No space left on device", "code: 28", "file write failed"))


def check_output_path(path: Path, what: str) -> None:
    """Before any writer writes PATH (a file or a folder; WHAT names the option for the fix): no link
    at PATH, every name in it within the file system's NAME_MAX and the whole within PATH_MAX, the
    nearest folder above it (it may not exist yet) a writable folder on a file system that is not
    read-only or full. One line each, the path and the reason."""
    absolute = Path(os.path.abspath(path))
    root = Path(absolute.anchor)  # the names are checked before any of them is looked up
    name_max, path_max = _pathconf(root, "PC_NAME_MAX", 255), _pathconf(root, "PC_PATH_MAX", 4096)
    too_long = any(len(os.fsencode(part)) > name_max for part in absolute.parts)
    if too_long or len(os.fsencode(str(absolute))) >= path_max:
        raise cannot_write(path, OSError(errno.ENAMETOOLONG, ""), what)
    if absolute.is_symlink():
        raise MpskitError(f"{path} is a link", f"give {what} a path that is no link: mpskit never writes through one")
    above = next(folder for folder in absolute.parents if folder.exists())
    if not above.is_dir():
        raise cannot_write(path, OSError(errno.ENOTDIR, ""), what)
    disk = os.statvfs(above)
    if disk.f_blocks == 0 and above.resolve().parts[1:2] in (("proc",), ("sys",)):
        raise MpskitError(f"cannot write {path}: {above} is not on a disk (a virtual file system)",
                          f"give {what} a path on a disk")  # fmt: skip
    if disk.f_flag & os.ST_RDONLY:
        raise cannot_write(path, OSError(errno.EROFS, ""), what)
    if not os.access(above, os.W_OK | os.X_OK):
        raise cannot_write(path, OSError(errno.EACCES, ""), what)
    if disk.f_blocks and shutil.disk_usage(above).free < MIN_FREE_BYTES:  # no blocks: a file system that counts none
        raise cannot_write(path, OSError(errno.ENOSPC, ""), what)


@contextlib.contextmanager
def writing(path: Path, what: str, doing: str) -> Iterator[None]:
    """One writer at a time for an output PATH (config -o, export -o, compare --out, tiny-model), after
    check_output_path: an exclusive lock on a hidden file beside it, .NAME.lock, that holds the writer's
    process number and goes when the write ends. A second writer is one line naming that process. The
    kernel drops the lock of a killed writer; its file stays, and the next writer takes it."""
    check_output_path(path, what)
    lock = path.parent / f".{path.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, holder = lock_files.take_lock_file(lock, doing)
    except OSError as err:
        raise cannot_write(path, err, what) from None
    if holder:
        problem = f"cannot write {path}: it is in use by {holder}"
        raise MpskitError(problem, f"wait until it ends, or give {what} another path")
    try:
        yield
    finally:
        lock_files.remove_own(fd, lock)


def _pathconf(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def make_new_folder(path: Path, what: str = "the run") -> Path:
    """PATH made by this process alone (PATH-2, PATH-3... when it exists): two commands started in the
    same second never share a folder named by the time."""
    check_output_path(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    made, tries = path, 1
    while True:
        try:
            made.mkdir()
            return made
        except FileExistsError:
            tries += 1
            made = path.with_name(f"{path.name}-{tries}")


def check_file_target(path: Path, force: bool) -> None:
    """A file an `-o` writes: absent, or with --force a regular file, which is replaced. Never a folder,
    a link, a device (/dev/null, /dev/stdout), a FIFO or a socket: the rename that writes it would put a
    file in their place."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        check_output_path(path, "-o")
        return
    except OSError as err:  # below a file, no permission, a name too long
        raise cannot_write(path, err, "-o") from None
    if not stat.S_ISREG(mode):
        raise MpskitError(f"{path} is not a regular file", "give -o a new file (--force replaces only a regular file)")
    if not force:
        raise MpskitError(f"{path} already exists", "give -o a new file, or add --force to replace it")


def set_aside(path: Path, label: str) -> Path:
    """Rename PATH to PATH.<label> (-2, -3... when taken): kept, never deleted. For checkpoint-N, that
    puts it out of LLaMA-Factory's (and transformers') own search for the last checkpoint, which
    matches only checkpoint-N."""
    aside, tries = path.with_name(f"{path.name}.{label}"), 1
    while aside.exists():
        tries += 1
        aside = path.with_name(f"{path.name}.{label}-{tries}")
    path.rename(aside)
    return aside


# Anchors are fine; a "billion laughs" of nested aliases (or a cycle) that expands past this is not.
MAX_YAML_NODES = 100_000


def expands_past(data, limit: int = MAX_YAML_NODES) -> bool:
    """Whether YAML's data, with every alias expanded, holds more than `limit` values."""
    stack, seen = [data], 0
    while stack:
        seen += 1
        if seen > limit:
            return True
        item = stack.pop()
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return False
