"""A run folder and everything mpskit keeps in it: the run record (mpskit.json), the written
llamafactory.yaml, LLaMA-Factory's trainer_log.jsonl, all_results.json and checkpoints, the lock, and
the `latest` link beside it. No torch import.

`RunDir` owns these files: a module that needs one asks the RunDir it was given; nothing else reads or
writes them (a test checks). The other files of a run are written by the module that makes them, into
the folder RunDir made: the plots (run/plots.py), train.log (run/quiet.py), rank-N.json of a
several-process run (run/attempts.py), and the evaluations (tools/evaluate.py, into RunDir.new_folder).
The record's fields are written down once, as `RunRecord` and its sections (`Attempt`, `Memory`,
`Duration`, `Ladder`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import sys
import types
import typing
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mpskit import lock_files
from mpskit.errors import MpskitError

RECORD = "mpskit.json"
YAML = "llamafactory.yaml"
LOG = "trainer_log.jsonl"
RESULTS = "all_results.json"
LOCK_NOTE = ".mpskit.lock"
DATASET_INFO = "dataset_info.json"  # a run's own, where its data are plain files registered for it
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "adapter_model.bin", "pytorch_model.bin",
                "model.safetensors.index.json")  # fmt: skip
FINISHED = "finished"


@dataclass
class Measured:
    """What the memory monitor measured in one attempt (run/monitor.py): GB above the process before any
    model loaded (baseline_gb), and seconds."""

    device: str = ""
    baseline_gb: float = 0.0
    peak_gb: float = 0.0  # the process's own
    training_gb: float = 0.0  # the peak above the baseline: "peak train memory", the plan's figure
    loaded_gb: float = 0.0  # after the model loaded, before the first step
    loading_peak_gb: float = 0.0  # the highest until then
    step_gb: float | None = None  # the highest in training steps, evaluations left out (None: not kept apart)
    eval_gb: float | None = None  # the highest in a held-out evaluation (None: none ran, or not kept apart)
    step_seconds: list[float] = field(default_factory=list)  # each optimizer step's wall time
    train_began_s: float | None = None  # seconds since the monitor started
    eval_spans_s: list[list[float]] = field(default_factory=list)  # [begin, end] of each evaluation
    samples_gb: list[list[float]] = field(default_factory=list)  # [seconds, GB], at most 300, for memory.png
    other_keys: dict = field(default_factory=dict)


@dataclass
class Attempt:
    """One training attempt in a run folder, however it ended."""

    attempt: int
    knobs: dict = field(default_factory=dict)  # the memory knobs it trained with, as arguments
    resumed_from: str | None = None  # checkpoint-N, or None from step 0
    outcome: str = ""  # "finished", "stopped by SIGINT ...", "out of memory", "error: ..."
    measured: Measured | None = None  # None: it ended before the monitor started
    predicted_gb: float | None = None  # the plan's training memory at this attempt's knobs
    lean_logits: dict | None = None  # what each lean path did (lean_trainers.LeanPath.report)
    lean_attention: dict | None = None
    device_figures: dict | None = None  # out of memory: the device's own figures
    next_rung: str | None = None  # out of memory: what the ladder moved next
    other_keys: dict = field(default_factory=dict)  # keys this mpskit does not know (a newer one's): kept

    def __post_init__(self) -> None:
        self.measured = _measured(self.measured)


@dataclass
class Memory:
    """A run's memory plan and what its attempts measured, in GB."""

    predicted: dict = field(default_factory=dict)  # memory.Estimate.as_dict(): parts_gb, training_gb, framework_gb
    # what the plan was computed from, so that a rung of the out-of-memory ladder is planned the same way:
    dims: dict = field(default_factory=dict)  # memory.ModelDims
    knobs: dict = field(default_factory=dict)  # knobs.Knobs of the latest plan (a rung's, after one)
    longest_batch: int | None = None  # the longest sequence the data makes (None: cutoff_len)
    budget_gb: float | None = None
    budget: str = ""  # where the budget comes from
    planner_changes: list[str] = field(default_factory=list)
    measured: Measured | None = None  # the latest attempt's, without its samples
    error: float | None = None  # (predicted - measured) / measured training memory, of the latest attempt
    other_keys: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.measured = _measured(self.measured)

    @property
    def predicted_training_gb(self) -> float | None:
        return self.predicted.get("training_gb")


@dataclass
class Duration:
    """How long a run was predicted to take (duration.RunDuration) and took, over every attempt."""

    predicted_step_s: float | None = None
    predicted_s: float | None = None
    steps: int | None = None
    examples: int | None = None
    epochs: float | None = None
    source: str = ""  # where the throughput figures come from
    measured_figures: bool = False  # whether they were measured on this machine
    unmeasured: str = ""  # why no duration was predicted (a quantized base on a device never timed so)
    measured_s: float = 0.0  # the training steps' time
    measured_steps: int = 0
    measured_step_s: float | None = None  # median
    error: float | None = None  # (predicted - measured) / measured, once finished
    other_keys: dict = field(default_factory=dict)


@dataclass
class Ladder:
    """What the out-of-memory fallback may move: the planner's free knobs and the cutoff floor."""

    free: list[str]
    cutoff_floor: int
    other_keys: dict = field(default_factory=dict)


@dataclass
class RunRecord:
    """mpskit.json: what was asked and decided before the run, then one entry per attempt."""

    run_name: str
    stage: str
    device: str
    hardware: dict = field(default_factory=dict)  # the profile's fields
    layers: list[str] = field(default_factory=list)  # the preset files merged, in order
    environment: dict[str, str] = field(default_factory=dict)  # MPS variables exported for the run
    mps_hidden: bool = False
    llamafactory_args: dict = field(default_factory=dict)  # exactly what llamafactory.yaml says
    mpskit_args: dict = field(default_factory=dict)  # mpskit's own run keys (lean paths), never in the YAML
    changed_from_given: dict = field(default_factory=dict)  # no preset: key -> [user's value, written value]
    model_dims: dict = field(default_factory=dict)
    data_rows: dict[str, int] = field(default_factory=dict)  # plain data files: entry name -> rows, checked if moved
    memory: Memory = field(default_factory=Memory)
    duration: Duration = field(default_factory=Duration)
    ladder: Ladder | None = None  # None: nothing may move (a rebuilt record)
    processes: list[int] = field(default_factory=lambda: [1, 1])  # per node, nodes
    keep_awake: bool = True  # macOS: caffeinate while the run trains
    command: list[str] = field(default_factory=list)
    started: str = ""
    versions: dict = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    other_keys: dict = field(default_factory=dict)  # keys this mpskit does not know (a newer one's): kept

    def __post_init__(self) -> None:
        """Read from JSON, the sections are dicts: typed here (keys this mpskit does not know kept aside)."""
        self.memory = _typed(Memory, self.memory)
        self.duration = _typed(Duration, self.duration)
        self.ladder = _typed(Ladder, self.ladder) if self.ladder else None
        self.attempts = [_typed(Attempt, entry) for entry in self.attempts]


def _measured(value: Measured | dict | None) -> Measured | None:
    """A monitor's figures read from JSON ({} in a record from before they were typed: none)."""
    return _typed(Measured, value) if value else None


def _typed(cls: type, value: object):
    if isinstance(value, cls):
        return value
    known = {f.name for f in dataclasses.fields(cls)} - {"other_keys"}
    other = {key: item for key, item in value.items() if key not in known}
    return cls(**{key: item for key, item in value.items() if key in known}, other_keys=other)


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


def write_record(run_dir: Path, record: RunRecord) -> None:
    write_atomic(run_dir / RECORD, json.dumps(_as_data(record), indent=2, default=str) + "\n")


def _as_data(value: object) -> object:
    """The record as JSON data: each section's fields, then the keys it did not know, where they were."""
    if dataclasses.is_dataclass(value):
        fields = {f.name: _as_data(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "other_keys"}
        return {**fields, **value.other_keys}
    if isinstance(value, list):
        return [_as_data(item) for item in value]
    return value


def read_record(run_dir: Path) -> RunRecord:
    """The run's record, each field of the type the record gives it; a damaged one is one line that
    names the field (or why it does not read) and --rebuild-record."""
    fix = f"rebuild it from llamafactory.yaml and the checkpoints: mpskit train --resume {run_dir} --rebuild-record"
    try:
        data = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError("not a mapping")
    except (OSError, ValueError, TypeError, RecursionError) as err:
        raise MpskitError(f"{run_dir / RECORD} is not a readable run record ({type(err).__name__})", fix) from err
    if damage := _damage(data, RunRecord, ""):
        raise MpskitError(f"{run_dir / RECORD} is damaged: {damage}", fix)
    known = {f.name for f in dataclasses.fields(RunRecord)} - {"other_keys"}
    other = {key: value for key, value in data.items() if key not in known}
    return RunRecord(**{key: value for key, value in data.items() if key in known}, other_keys=other)


# Keys of the plan's figures (Memory.predicted) that readers do arithmetic with: a number, or numbers
# in a list (of numbers or of pairs) or a mapping. (The monitor's are typed: Measured.)
FIGURE_SUFFIXES = ("_gb", "_s", "_seconds")


def _damage(data: dict, cls: type, where: str) -> str | None:
    """What in DATA (a record section read from JSON) is not of the type CLS gives it; None if all is.
    Keys CLS does not know are a newer mpskit's and pass; a missing field takes its default, or is
    damage where it has none."""
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        name = f"{where}{item.name}"
        if item.name not in data:
            no_default = item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
            if no_default and item.name != "other_keys":
                return f"{name} is missing"
            continue
        value, hint = data[item.name], hints[item.name]
        if not _is_of(value, hint):
            return f"{name} is {json.dumps(value)[:40]}, not {_type_words(hint)}"
        inner = [h for h in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(h)]
        if inner and isinstance(value, dict) and (damage := _damage(value, inner[0], f"{name}.")):
            return damage
        if hint == list[Attempt]:
            for number, entry in enumerate(value, start=1):
                if damage := _damage(entry, Attempt, f"{name}[{number}]."):
                    return damage
        if item.name == "predicted" and (damage := _figure_damage(value, name)):
            return damage
    return None


def _figure_damage(figures: dict, where: str) -> str | None:
    for key, figure in figures.items():
        numbers = figure.values() if isinstance(figure, dict) else figure if isinstance(figure, list) else [figure]
        if isinstance(figure, list) and all(isinstance(entry, list) and len(entry) == 2 for entry in figure):
            numbers = [number for pair in figure for number in pair]  # samples: [seconds, GB]; spans
        if key.endswith(FIGURE_SUFFIXES) and not all(_is_of(number, float | None) for number in numbers):
            return f"{where}.{key} is {json.dumps(figure)[:40]}, not a figure"
    return None


def _is_of(value, hint) -> bool:
    """Whether a value read from JSON is of the type HINT (int | None, list[str], a dataclass: a
    mapping); a bool is no number, and an int is a float."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_is_of(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, int if hint is int else int | float) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_is_of(entry, args[0]) for entry in value)
    if origin is dict:
        return isinstance(value, dict) and all(_is_of(entry, args[1]) for entry in value.values())
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return isinstance(value, origin or hint)


def _type_words(hint) -> str:
    words = {str: "text", int: "a whole number", float: "a number", bool: "true or false", dict: "a mapping",
             type(None): "null"}  # fmt: skip
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(_type_words(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"a list of {_type_words(typing.get_args(hint)[0]).removeprefix('a ')}s"
    if typing.get_origin(hint) is dict:
        return f"a mapping to {_type_words(typing.get_args(hint)[1]).removeprefix('a ')}s"
    return words.get(hint, "a mapping")


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


def args_text(args: dict) -> str:
    """llamafactory.yaml's text for ARGS, in their order."""
    return yaml.safe_dump(args, sort_keys=False, allow_unicode=True)


def read_yaml(run_dir: Path) -> dict:
    """llamafactory.yaml's arguments, as LLaMA-Factory reads them."""
    fix = f"restore it: mpskit.json's llamafactory_args hold what it said ({run_dir / RECORD})"
    try:
        args = yaml.safe_load((run_dir / YAML).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, RecursionError) as err:
        raise MpskitError(f"{run_dir / YAML} is not readable ({type(err).__name__})", fix) from None
    if expands_past(args):
        raise MpskitError(f"{run_dir / YAML} expands past {MAX_YAML_NODES} values (nested aliases)", fix)
    if not isinstance(args, dict):
        raise MpskitError(f"{run_dir / YAML} holds no arguments", "restore it from mpskit.json's llamafactory_args")
    return args


def is_run_dir(run_dir: Path) -> bool:
    return (run_dir / RECORD).is_file() and (run_dir / YAML).is_file()


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
        if wrong := next((key for key, value in entry.items() if not _is_of(value, _log_type(key))), None):
            raise MpskitError(f"{path}: line {number}: {wrong} is {json.dumps(entry[wrong])[:40]}, not a number",
                              "restore the file or delete that line")  # fmt: skip
        entries.append(entry)
    return entries


# What LLaMA-Factory logs: numbers (loss, lr, steps, rewards/...), times as text ("0:01:02"), null;
# the figures mpskit reads are numbers.
LOG_NUMBERS = ("current_steps", "total_steps", "loss", "eval_loss", "lr", "epoch", "percentage")


def _log_type(key: str) -> object:
    return float | None if key in LOG_NUMBERS or key.startswith(("rewards/", "eval_")) else float | str | None


def checkpoints(run_dir: Path) -> list[Path]:
    """checkpoint-N folders, oldest first."""
    steps = [(int(m[1]), p) for p in run_dir.glob("checkpoint-*") if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return [path for _, path in sorted(steps)]


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step a complete checkpoint saved (its trainer_state.json's global_step)."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    step = state.get("global_step") if isinstance(state, dict) else None
    return step if isinstance(step, int) else None


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or None. transformers writes trainer_state.json after
    the weights and the optimizer, so a readable one means the save finished."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable trainer_state.json (killed while saving?)"
    weights = [checkpoint / name for name in WEIGHT_FILES if (checkpoint / name).is_file()]
    if not weights:
        return "no weights"
    if weights[0].suffix == ".safetensors" and not _safetensors_whole(weights[0]):
        return f"{weights[0].name} is cut short"
    for name in ("optimizer.pt", "scheduler.pt"):
        if not _torch_file(checkpoint / name):
            return f"no readable {name}"
    return None


def _torch_file(path: Path) -> bool:
    """What torch.save writes: a zip archive (its index is at the end, so a cut-short file has none)
    holding <name>/data.pkl."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("/data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _safetensors_whole(path: Path) -> bool:
    """safetensors reads the file: its header, and tensors that the file covers (one cut short is
    "incomplete metadata")."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="numpy"):
            return True
    except (SafetensorError, OSError, ValueError):
        return False


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


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint a run can resume from. Newer, incomplete ones are set aside."""
    for checkpoint in reversed(checkpoints(run_dir)):
        why = incomplete_reason(checkpoint)
        if why is None:
            return checkpoint
        aside = set_aside(checkpoint, "incomplete")
        print(f"mpskit: skipped {checkpoint.name}: {why}; kept as {aside.name}", file=sys.stderr)
    return None


def point_latest(run_dir: Path, root: str | Path = "output") -> None:
    """output/<run>/latest -> this run folder, unless something else the user made is there. Only
    for a folder mpskit made under output/: never beside a user's own output_dir (a model folder...)."""
    if run_dir.resolve().parent.parent != Path(root).resolve():
        return
    latest = run_dir.parent / "latest"
    ours = latest.is_symlink() and "/" not in os.readlink(latest)  # mpskit links to a sibling folder
    if ours or not (latest.exists() or latest.is_symlink()):
        if ours:
            latest.unlink()
        latest.symlink_to(run_dir.name)


def latest_run_dir(root: str | Path = "output") -> Path:
    """The newest run folder that some output/<run>/latest points at, for a command given no run
    (`--resume`, chat, export); it says which, as the user did not."""
    runs = [link.resolve() for link in Path(root).glob("*/latest") if link.is_symlink() and link.resolve().is_dir()]
    if not runs:
        raise MpskitError(f"no run found under {root}/", "give the run directory, output/<run>/<timestamp>")
    newest = max(runs, key=lambda path: (path / RECORD).stat().st_mtime if (path / RECORD).exists() else 0)
    print(f"mpskit: the newest run: {os.path.relpath(newest)}", file=sys.stderr)
    return newest


def new_run_dir(run_name: str, output_dir: str | None, root: str | Path = "output") -> Path:
    """output/<run>/<timestamp>: a fresh directory; an explicit output_dir must be new or empty."""
    if output_dir:
        path = Path(str(output_dir)).expanduser()
        if path.is_symlink() and not path.exists():
            raise MpskitError(f"output_dir {path} is a link to nothing", "set output_dir to a folder, or fix the link")
        if path.exists() and not path.is_dir():
            raise MpskitError(f"output_dir {path} is a file", "set output_dir to a new folder")
        if path.exists() and any(path.iterdir()):
            raise MpskitError(
                f"output_dir {path} already holds files", "choose a new output_dir; mpskit never overwrites a run"
            )
        return path
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(root) / run_name / stamp
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / run_name / f"{stamp}-{suffix}"
    return path


def real_run_path(path: Path) -> Path:
    """PATH with every link in it followed: `output/<run>/latest`, or a link of the user's, names the
    run folder itself, which is where a run's files and its `latest` are written."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a loop of links
        raise MpskitError(f"{path} cannot be followed to a folder ({err})", "give the run folder itself") from None


def claim_run_dir(run_name: str, output_dir: str | None, root: str | Path = "output") -> Path:
    """The folder of a new run (new_run_dir's), made and claimed by this process alone: its mpskit.json
    is created exclusively, so two runs started in the same second, or on one empty output_dir, never
    share a folder (the second takes the next name, or is refused). Never inside a model folder or
    another run's folder. RunDir.create then writes the files; `release` undoes a claim it never used."""
    while True:
        path = new_run_dir(run_name, output_dir, root)
        container = next((folder for folder in path.absolute().parents if _model_or_run(folder)), None)
        if container:
            raise MpskitError(f"the run folder {path} would be inside {_model_or_run(container)} {container}",
                              "choose another run_name or output_dir")  # fmt: skip
        check_output_path(path, "run_name or output_dir")
        path.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(path / RECORD, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
            return path
        except FileExistsError:
            if output_dir:
                raise MpskitError(f"output_dir {path} was taken by another run", "choose a new output_dir") from None


def release(path: Path) -> None:
    """Undo a claim that wrote nothing more: the empty record goes, and the folder when empty."""
    with contextlib.suppress(OSError):
        if (path / RECORD).stat().st_size == 0:
            (path / RECORD).unlink()
            path.rmdir()


def _model_or_run(folder: Path) -> str | None:
    if is_run_dir(folder):
        return "the run"
    if (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHT_FILES):
        return "the model folder"
    return None


# Fields a damaged record may still hold readably, with their types: a rebuilt record keeps them.
RECOVERABLE = ("run_name", "mpskit_args", "model_dims", "layers", "keep_awake", "processes", "started",
               "changed_from_given", "data_rows")  # fmt: skip


def check_rebuildable(run_dir: Path, args: dict) -> None:
    """--rebuild-record is for a run folder mpskit made whose record is damaged or gone: one holding
    mpskit.json (unreadable), a record set aside before, or a llamafactory.yaml whose output_dir is
    this folder. Never for a readable record (it would lose the run's plan, results and lean paths),
    nor for a folder of the user's that holds a llamafactory.yaml."""
    try:
        read_record(run_dir)
    except MpskitError:
        pass
    else:
        raise MpskitError(f"{run_dir / RECORD} is readable: --rebuild-record is for a damaged one",
                          f"resume the run as it is: mpskit train --resume {run_dir}")  # fmt: skip
    named = str(args.get("output_dir", ""))
    ours = (run_dir / RECORD).exists() or any(run_dir.glob(f"{RECORD}.damaged*"))
    if not ours and not (named and Path(named).resolve() == run_dir.resolve()):
        raise MpskitError(f"{run_dir} holds no run record: not a run folder mpskit made",
                          f"train its YAML into a new folder: mpskit train {run_dir / YAML}")  # fmt: skip


def recoverable_fields(run_dir: Path) -> dict:
    """What of a damaged record still reads with the right type (RECOVERABLE): the lean paths, the
    model's dims, the process layout... {} when it is not JSON."""
    try:
        data = json.loads((run_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    hints = typing.get_type_hints(RunRecord)
    return {key: data[key] for key in RECOVERABLE if key in data and _is_of(data[key], hints[key])}


class RunDir:
    """One run folder, opened once and passed around: its record lives here in memory and is saved
    (atomically) after each change. Every file of the folder is read and written through it."""

    def __init__(self, path: Path, record: RunRecord) -> None:
        self.path = path
        self.record = record

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        path = real_run_path(Path(path))
        if not is_run_dir(path):
            raise MpskitError(f"{path} is not an mpskit run directory", "give a folder that holds mpskit.json")
        return cls(path, read_record(path))

    @classmethod
    def create(cls, path: Path, record: RunRecord, yaml_text: str, files: dict[str, str] | None = None) -> RunDir:
        """A new run folder (or the user's empty output_dir) with its llamafactory.yaml and record, after
        the FILES it reads (name -> text: a dataset_info.json of plain data files)."""
        path.mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():
            write_atomic(path / name, text)
        run = cls(path, record)
        write_atomic(run.path / YAML, yaml_text)
        run.save()
        return run

    @classmethod
    def rebuilt(cls, path: str | Path, record: RunRecord) -> RunDir:
        """The folder with RECORD in place of a damaged (or missing) mpskit.json, which is kept beside
        it as mpskit.json.damaged."""
        path = Path(path)
        if (path / RECORD).exists():
            set_aside(path / RECORD, "damaged")
        run = cls(path, record)
        run.save()
        return run

    def save(self) -> None:
        write_record(self.path, self.record)

    def yaml_args(self) -> dict:
        return read_yaml(self.path)

    def change_args(self, changes: dict, own_keys: tuple[str, ...]) -> None:
        """What an out-of-memory rung changed becomes the run's own before its next attempt: in
        llamafactory.yaml (mpskit's OWN_KEYS in the record's mpskit_args instead) and the record, so a
        kill at any moment resumes with what trains now, and the YAML says it."""
        written = {**self.yaml_args(), **{key: value for key, value in changes.items() if key not in own_keys}}
        write_atomic(self.path / YAML, args_text(written))
        self.record.llamafactory_args = written
        self.record.mpskit_args.update({key: value for key, value in changes.items() if key in own_keys})
        self.save()

    def train_args(self) -> dict:
        """What a training attempt runs with: the YAML's arguments, mpskit's own keys from the record,
        and this folder as output_dir wherever it now is (a copied or moved run trains there only); the
        same for dataset_dir where the data is registered in the folder itself (plain data files)."""
        args = self.yaml_args()
        own_data = {"dataset_dir": str(self.path)} if args.get("dataset_dir") == args.get("output_dir") else {}
        return {**args, **self.record.mpskit_args, "output_dir": str(self.path), **own_data}

    def registered_data(self) -> dict:
        """The entries of the run's own dataset_info.json (its plain data files); {} where the run reads
        a data folder of the user's."""
        args = self.yaml_args()
        if args.get("dataset_dir") != args.get("output_dir"):
            return {}
        path = self.path / DATASET_INFO
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise MpskitError(f"{path} is not readable JSON ({err})", "train the run again from its command") from None
        if not isinstance(entries, dict) or not all(isinstance(entry, dict) for entry in entries.values()):
            raise MpskitError(f"{path} is not a mapping of dataset entries", "train the run again from its command")
        return entries

    def register_data(self, dataset_info_text: str) -> None:
        write_atomic(self.path / DATASET_INFO, dataset_info_text)

    def results(self, folder: Path | None = None) -> dict:
        """all_results.json of the run, or of an evaluation folder in it; {} when none was written."""
        path = (folder or self.path) / RESULTS
        try:
            return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, ValueError) as err:
            raise MpskitError(f"{path} is not readable JSON", "train or evaluate the run again") from err

    def log(self) -> list[dict]:
        return read_log(self.path)

    def newest_evaluation(self) -> dict:
        """The results `mpskit eval` wrote last into eval/<dataset>-<time>/; {} when it never ran."""
        written = [path for path in (self.path / "eval").glob(f"*/{RESULTS}") if not path.parent.is_symlink()]
        return self.results(max(written, key=lambda path: path.stat().st_mtime).parent) if written else {}

    def mend_log(self) -> None:
        """Before a resume: a last line of trainer_log.jsonl cut short (a kill mid-append) is dropped,
        so that LLaMA-Factory's next entry starts a line of its own instead of joining it."""
        path = self.path / LOG
        with contextlib.suppress(FileNotFoundError), open(path, "rb+") as file:
            text = file.read()
            whole = text.rfind(b"\n") + 1
            if whole < len(text):
                file.truncate(whole)
                print(f"mpskit: {path} ended in a line cut short ({len(text) - whole} bytes, written as the run "
                      "was killed); it now ends at its last whole entry", file=sys.stderr)  # fmt: skip

    def trained_to_the_end(self) -> bool:
        """Results written (LLaMA-Factory writes them at a stop too) and, where the folder says, the steps
        reached as many as planned: trainer_state.json at the end, else the trainer's log."""
        if "train_runtime" not in self.results():
            return False
        try:
            state = json.loads((self.path / "trainer_state.json").read_text(encoding="utf-8"))
            reached, planned = state["global_step"], state["max_steps"]
        except (OSError, ValueError, KeyError, TypeError):
            log = self.log()
            reached, planned = (log[-1].get("current_steps"), log[-1].get("total_steps")) if log else (None, None)
        return not (isinstance(reached, int) and isinstance(planned, int)) or reached >= planned

    def checkpoints(self) -> list[Path]:
        return checkpoints(self.path)

    def last_checkpoint(self) -> Path | None:
        return last_checkpoint(self.path)

    def step_reached(self) -> str:
        log = self.log()
        return f"after step {log[-1].get('current_steps')}" if log else "before the first logged step"

    @property
    def finished(self) -> bool:
        return bool(self.record.attempts) and self.record.attempts[-1].outcome == FINISHED

    def add_attempt(self, attempt: Attempt) -> None:
        self.record.attempts.append(attempt)
        self.save()

    @contextlib.contextmanager
    def locked(self, doing: str) -> Iterator[None]:
        """One process at a time in this folder: an exclusive lock on the folder itself, which the
        kernel releases when the process ends, however it ends. A second process is told who holds it
        (from a note the holder leaves in the folder while it works)."""
        fd, note = os.open(self.path, os.O_RDONLY), self.path / LOCK_NOTE
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = lock_files.read_note(note) or "another process"
            raise MpskitError(
                f"{self.path} is in use by {holder}", "wait until it ends (or stop it), then run this again"
            ) from None
        try:
            note_fd = lock_files.leave_note(note, doing)
        except BaseException:
            os.close(fd)
            raise
        try:
            self.record = read_record(self.path)  # as the last holder left it
            yield
        finally:
            lock_files.remove_own(note_fd, note)
            os.close(fd)

    def check_no_links(self) -> None:
        """No link among the folder's entries or its checkpoints': LLaMA-Factory and the libraries write
        a run's files by name, and would write through a link to wherever it points."""
        for folder in (self.path, *checkpoints(self.path)):
            for entry in os.scandir(folder):
                if entry.is_symlink():
                    raise MpskitError(
                        f"{entry.path} is a link (to {os.readlink(entry.path)}): the run writes its files by name "
                        "and would write through it",
                        "put the file itself there, or move the link away; then resume",
                    )

    def new_folder(self, parent: str, name: str) -> Path:
        """A new folder PARENT/NAME inside the run (eval/<dataset>-<time>), made without following a
        link: a link at PARENT would send what is written there outside the run."""
        where = self.path / parent
        if where.is_symlink():
            raise MpskitError(f"{where} is a link", f"move it away: mpskit writes {parent}/ inside the run only")
        where.mkdir(exist_ok=True)
        return make_new_folder(where / name)
