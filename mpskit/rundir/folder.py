"""A run folder: where a new one goes (output/<run>/<timestamp>, claimed by one process), the
`latest` link beside it, its llamafactory.yaml, and `RunDir`, the folder opened once and passed
around, through which mpskit reads and writes the run's record, arguments and data registration. The
trainer writes its checkpoints, logs and results itself, and each rank its rank-N.json. No torch import.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from mpskit import lock_files
from mpskit.errors import MpskitError
from mpskit.files import MAX_YAML_NODES, check_output_path, expands_past, make_new_folder, set_aside, write_atomic
from mpskit.rundir import trainer_log
from mpskit.rundir.checkpoints import WEIGHT_FILES, checkpoints, last_checkpoint
from mpskit.rundir.record import FINISHED, RECORD, Attempt, RunRecord, read_record, write_record

YAML = "llamafactory.yaml"
RESULTS = "all_results.json"
LOCK_NOTE = ".mpskit.lock"
DATASET_INFO = "dataset_info.json"  # a run's own, where its data are plain files registered for it


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


def new_run_dir(run_name: str, output_dir: str | None, root: str | Path = "output", suffix: str = "") -> Path:
    """output/<run>/<timestamp><suffix>: a fresh directory (the suffix names a node among several); an
    explicit output_dir must be new or empty."""
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
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + suffix
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


def claim_run_dir(run_name: str, output_dir: str | None, root: str | Path = "output", suffix: str = "") -> Path:
    """The folder of a new run (new_run_dir's), made and claimed by this process alone: its mpskit.json
    is created exclusively, so two runs started in the same second, or on one empty output_dir, never
    share a folder (the second takes the next name, or is refused). Never inside a model folder or
    another run's folder. RunDir.create then writes the files; `release` undoes a claim it never used."""
    while True:
        path = new_run_dir(run_name, output_dir, root, suffix)
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


class RunDir:
    """One run folder, opened once and passed around: its record lives here in memory and is saved
    (atomically) after each change."""

    def __init__(self, path: Path, record: RunRecord) -> None:
        self.path = path
        self.record = record

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        path = real_run_path(Path(path))
        if not is_run_dir(path):
            record = path / RECORD
            if record.exists() or record.is_symlink():  # a folder, a FIFO, a device, a link at its name
                raise MpskitError(f"{record} is not a file, so the run's record cannot be read",
                                  f"move it away, then: mpskit train --resume {path} --rebuild-record")  # fmt: skip
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
        return trainer_log.read_log(self.path)

    def newest_evaluation(self) -> dict:
        """The results `mpskit eval` wrote last into eval/<dataset>-<time>/; {} when it never ran."""
        written = [path for path in (self.path / "eval").glob(f"*/{RESULTS}") if not path.parent.is_symlink()]
        return self.results(max(written, key=lambda path: path.stat().st_mtime).parent) if written else {}

    def mend_log(self, from_step: int) -> None:
        trainer_log.mend(self.path, from_step)

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
        """One process at a time in this folder (lock_files.hold_folder); the record is read again
        under the lock, as the last holder left it."""
        with lock_files.hold_folder(self.path, self.path / LOCK_NOTE, doing):
            self.record = read_record(self.path)
            yield

    def in_use_by(self) -> str | None:
        """The process that holds this folder now (training it, say), or None."""
        return lock_files.holder_of(self.path, self.path / LOCK_NOTE)

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
