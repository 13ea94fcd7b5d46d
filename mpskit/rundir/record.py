"""The run record, mpskit.json: its fields written down once as `RunRecord` and its sections
(`Attempt`, `Memory`, `Duration`, `Ladder`, `Measured`), and its reading, which checks each field's
type and names a wrong one in one line. No torch import.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.files import write_atomic

RECORD = "mpskit.json"
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
    libraries_gb: float = 0.0  # shared libraries' pages first used after the baseline, at the peak: not in the above
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
    engine: dict | None = None  # the engine that ran (engine/engine_ran.py): DeepSpeed, FSDP, DDP, processes
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
    allocator: str = ""  # machine/allocator.py's name of the plan's profile ("": the device's usual one)
    longest_batch: int | None = None  # the longest sequence the data makes (None: cutoff_len)
    scored_positions: int | None = None  # the most positions a sequence scores (None: every position)
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
    """A section (or the record) read from JSON as CLS, the keys CLS does not know kept aside."""
    if isinstance(value, cls):
        return value
    known = {f.name for f in dataclasses.fields(cls)} - {"other_keys"}
    other = {key: item for key, item in value.items() if key not in known}
    return cls(**{key: item for key, item in value.items() if key in known}, other_keys=other)


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
    if damage := _damage(data):
        raise MpskitError(f"{run_dir / RECORD} is damaged: {damage}", fix)
    return _typed(RunRecord, data)


# Keys of the plan's figures (Memory.predicted) that readers do arithmetic with: a number, or numbers
# in a list (of numbers or of pairs) or a mapping. (The monitor's are typed: Measured.)
FIGURE_SUFFIXES = ("_gb", "_s", "_seconds")


# A UTF-16 surrogate escape in JSON text (not one after an escaped backslash): Python's reader takes a
# lone one (a file name's undecodable byte, kept by surrogateescape), pydantic's does not.
SURROGATE_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _damage(data: dict) -> str | None:
    """What in the record (DATA, read from JSON) is not of the type RunRecord gives it; None if all is.
    pydantic checks it strictly against the dataclasses, as JSON (where a mapping may stand for a
    dataclass): a bool is no number, "1" no whole number; keys the dataclasses do not know (a newer
    mpskit's) pass, and a missing field takes its default, or is damage where it has none."""
    from pydantic import ValidationError

    text = SURROGATE_ESCAPE.sub(r"\1?", json.dumps(data))  # a text is a text, whatever its characters
    try:
        _adapter(RunRecord).validate_json(text, strict=True)
    except ValidationError as err:
        return _words(data, err.errors()[0])
    return _figure_damage(data.get("memory", {}).get("predicted", {}), "memory.predicted")


def _words(data: dict, error: dict) -> str:
    """pydantic's error as the record's reader says it: the field (attempts[1].measured.peak_gb, or
    the list or mapping field that holds the wrong value), what it is, and what it should be."""
    if error["type"] == "json_invalid":  # nested deeper than pydantic reads
        return f"it does not read ({error['msg']})"
    hint, value, name = RunRecord, data, ""
    for key in error["loc"]:
        section = next((h for h in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(h)), None)
        element = (typing.get_args(hint) or [None])[0]
        if section and isinstance(key, str) and isinstance(value, dict):
            if key not in value:
                return f"{name}.{key} is missing".lstrip(".")
            hint, value, name = typing.get_type_hints(section)[key], value[key], f"{name}.{key}".lstrip(".")
        elif isinstance(value, list) and dataclasses.is_dataclass(element) and isinstance(value[key], dict):
            hint, value, name = element, value[key], f"{name}[{key + 1}]"
        else:
            break
    return f"{name} is {json.dumps(value)[:40]}, not {_type_words(hint)}"


def _figure_damage(figures: dict, where: str) -> str | None:
    for key, figure in figures.items():
        numbers = figure.values() if isinstance(figure, dict) else figure if isinstance(figure, list) else [figure]
        if isinstance(figure, list) and all(isinstance(entry, list) and len(entry) == 2 for entry in figure):
            numbers = [number for pair in figure for number in pair]  # samples: [seconds, GB]; spans
        if key.endswith(FIGURE_SUFFIXES) and not all(is_of(number, float | None) for number in numbers):
            return f"{where}.{key} is {json.dumps(figure)[:40]}, not a figure"
    return None


def is_of(value: object, hint: object) -> bool:
    """Whether a value read from JSON is of the type HINT (int | None, list[str]...), as pydantic
    checks it strictly: a bool is no number, and an int is a float."""
    from pydantic import ValidationError

    try:
        _adapter(hint).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


@functools.lru_cache
def _adapter(hint: object):
    from pydantic import TypeAdapter

    return TypeAdapter(hint)


def _type_words(hint) -> str:
    words = {str: "text", int: "a whole number", float: "a number", bool: "true or false", dict: "a mapping",
             type(None): "null"}  # fmt: skip
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(_type_words(arg) for arg in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        return f"a list of {_plural(_type_words(typing.get_args(hint)[0]))}"
    if typing.get_origin(hint) is dict:
        return f"a mapping to {_plural(_type_words(typing.get_args(hint)[1]))}"
    return words.get(hint, "a mapping")


def _plural(words: str) -> str:
    """a whole number -> whole numbers; a list of numbers -> lists of numbers."""
    head, separator, rest = words.removeprefix("a ").partition(" of ")
    return f"{head}s{separator}{rest}"


# Fields a damaged record may still hold readably, with their types: a rebuilt record keeps them.
RECOVERABLE = ("run_name", "mpskit_args", "model_dims", "layers", "keep_awake", "processes", "started",
               "changed_from_given", "data_rows")  # fmt: skip


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
    return {key: data[key] for key in RECOVERABLE if key in data and is_of(data[key], hints[key])}
