"""Plain data files as datasets: `dataset=path/to/train.jsonl` or `dataset=DIR` (train and valid files).

LLaMA-Factory reads datasets only through a dataset_info.json entry. mpskit writes that entry for a
plain JSON or JSON Lines file, as mlx-lm's `--data DIR` does, its shape told from its rows
(data_shapes.py: alpaca, ShareGPT and OpenAI messages, TRL's, UltraFeedback's, HH-RLHF's and
LLaMA-Factory's preference and KTO layouts, text). The entries, and the rows converted where no
mapping reads a shape, go to a folder of mpskit's own (never the package's or the user's): a private
temporary one for the checks and the plan, the run folder for the run itself (recipes/train.py).
No torch import.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

from mpskit.datasets.data_shapes import DEFAULT_STAGE, for_stage, read_shape
from mpskit.datasets.dataset_checks import NOT_A_FILE, read_rows, split_names
from mpskit.errors import MpskitError
from mpskit.files import read_json, write_atomic
from mpskit.rundir.folder import DATASET_INFO
from mpskit.stages import stage_of
from mpskit.temporary import private_folder

SUFFIXES = (".jsonl", ".json")
TRAIN_NAMES = ("train",)
VALID_NAMES = ("valid", "validation", "val", "eval", "test")


def _is_path(name: str, registered: frozenset[str] = frozenset()) -> bool:
    """A file or folder: a data suffix, a separator, or a bare word that names no registered dataset and
    exists here (a registered name wins over a file of the same name in the working folder)."""
    if name.endswith(SUFFIXES) or os.sep in name:
        return True
    return name not in registered and Path(name).expanduser().exists()


def _registered(user: dict) -> frozenset[str]:
    """The dataset names of the dataset_info.json that dataset_dir (LLaMA-Factory's default: data) holds."""
    try:
        info = read_json(Path(str(user.get("dataset_dir", "data"))).expanduser() / DATASET_INFO)
    except (OSError, ValueError, RecursionError):  # check_datasets says what is wrong with it
        return frozenset()
    return frozenset(info) if isinstance(info, dict) else frozenset()


def named_data(value) -> set[str]:
    """What a dataset=/eval_dataset= value names: dataset names as they are, files and folders as
    absolute paths."""
    return {str(Path(name).expanduser().absolute()) if _is_path(name) else name for name in split_names(value)}


def _split_file(folder: Path, names: tuple[str, ...]) -> Path | None:
    found = [folder / f"{name}{suffix}" for name in names for suffix in SUFFIXES]
    odd = next((path for path in found if path.exists() and not path.is_file()), None)
    if odd is not None:  # a FIFO, a folder: reading one would wait or fail
        raise MpskitError(f"{odd}, {NOT_A_FILE}", f"put the rows in a plain file there, or move {odd.name} away")
    return next((path for path in found if path.is_file()), None)


def _files(name: str, key: str, with_valid: bool) -> list[tuple[str, Path]]:
    """(dataset key, file) for one path given as `key`: a file, or a folder's train file and, when
    `with_valid`, its valid file as the eval_dataset."""
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise MpskitError(f"{key}={name} is not a .json or .jsonl file", "give a JSON or JSON Lines file")
        return [(key, path.absolute())]
    if path.exists() and not path.is_dir():
        raise MpskitError(f"{key}={name}, {NOT_A_FILE}", "give a .jsonl/.json file, a folder or a dataset name")
    if not path.is_dir():
        raise MpskitError(
            f"{key}={name}: no such file or folder", "give a .jsonl/.json file, a folder or a dataset name"
        )
    if (path / DATASET_INFO).is_file():
        raise MpskitError(
            f"{key}={name} is a LLaMA-Factory data folder (it holds dataset_info.json)",
            f"name a dataset in it: dataset_dir={name} dataset=NAME",
        )
    wanted = TRAIN_NAMES if key == "dataset" else VALID_NAMES
    found = _split_file(path, wanted)
    if found is None:
        raise MpskitError(f"{name} holds no {wanted[0]}.jsonl or {wanted[0]}.json", "add one, or give the file itself")
    valid = _split_file(path, VALID_NAMES) if with_valid and key == "dataset" else None
    return [(key, found.absolute())] + ([("eval_dataset", valid.absolute())] if valid else [])


def _entry_name(path: Path, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]", "_", f"{path.parent.name}_{path.stem}").strip("_") or "data"
    name, number = base, 1
    while name in taken:
        number += 1
        name = f"{base}_{number}"
    return name


def register_plain_data(user: dict, stage: str | None) -> tuple[dict, dict, dict]:
    """(the user's settings with plain files replaced by registered names and dataset_dir, the
    entries, the converted files: name -> JSON Lines text); unchanged and {} when the datasets are
    names. Each file is read as its shape (data_shapes.py) as STAGE trains it; with no stage, the
    stage follows the training data and is set in the settings. A folder's valid file is the
    eval_dataset unless the user gives one or a val_size."""
    given = {key: split_names(user.get(key)) for key in ("dataset", "eval_dataset")}
    registered = _registered(user)
    paths = {key: [name for name in names if _is_path(name, registered)] for key, names in given.items()}
    for name in sorted({name for names in given.values() for name in names if name in registered}):
        if Path(name).expanduser().exists():
            print(f"mpskit: {name} is the dataset of that name in {user.get('dataset_dir', 'data')}/{DATASET_INFO}, "
                  f"not ./{name} here (give ./{name} to read that one)", file=sys.stderr)  # fmt: skip
    if not any(paths.values()):
        return user, {}, {}
    _check_names(user, given, paths)
    with_valid = not (user.get("eval_dataset") or user.get("val_size"))  # the user's evaluation wins
    files = [pair for key, names in paths.items() for name in names for pair in _files(name, key, with_valid)]
    shapes = [(key, path, read_shape(read_rows(path), str(path))) for key, path in files]
    user = dict(user)
    if stage is None and shapes[0][0] == "dataset":
        stage = user["stage"] = DEFAULT_STAGE[shapes[0][2].kind]
        print(f"mpskit: stage {stage}, as {shapes[0][1].name} holds {shapes[0][2].words}", file=sys.stderr)
    entries, converted, chosen = _entries(shapes, stage)
    for key, names in chosen.items():
        if names:
            user[key] = ",".join(names)
    if chosen["eval_dataset"] and not paths["eval_dataset"] and "eval_strategy" not in user:
        user["eval_strategy"] = "epoch"  # a folder's valid file is there to be evaluated on, as in mlx-lm
    user["dataset_dir"] = str(registration_folder(entries, converted))
    return user, entries, converted


def _check_names(user: dict, given: dict, paths: dict) -> None:
    """Files or names in each of dataset and eval_dataset, not both; no eval_dataset name and no
    dataset_dir beside training files."""
    for key, names in given.items():
        if paths[key] and len(paths[key]) != len(names):
            raise MpskitError(
                f"{key}={user[key]} mixes files with dataset names",
                "give files only (they are registered for the run), or register them all in a dataset_info.json",
            )
    if paths["dataset"] and given["eval_dataset"] and not paths["eval_dataset"]:
        raise MpskitError(
            f"eval_dataset={user['eval_dataset']} is a dataset name, and dataset={user['dataset']} is a file, "
            "so no dataset_info.json is read for the name",
            "give eval_dataset a file too, or leave it out (val_size=0.1 holds out a tenth of the file)",
        )
    if paths["dataset"] and "dataset_dir" in user:
        raise MpskitError(
            f"dataset={user['dataset']} is a file, so dataset_dir={user['dataset_dir']} is not read",
            "leave out dataset_dir, or name a dataset of its dataset_info.json",
        )


def _entries(shapes: list, stage: str | None) -> tuple[dict, dict, dict]:
    """(the dataset_info.json entries, the converted files, the names chosen for dataset and
    eval_dataset) of the files read as SHAPES, each said in a line."""
    entries, converted, chosen = {}, {}, {"dataset": [], "eval_dataset": []}
    for key, path, shape in shapes:
        name = _entry_name(path, set(entries))
        shape, line = for_stage(shape, stage, stage_of(stage).rows, str(path)) if stage else (shape, None)
        if shape.bad and sum(shape.bad.values()) == shape.rows:
            raise MpskitError(f"{path}: no row reads as {shape.words} ({shape.why()})",
                              "fix the rows, or name the columns in a dataset_info.json of your own")  # fmt: skip
        if shape.converted is None:
            entries[name] = {"file_name": str(path), **shape.entry}
        else:
            entries[name] = {"file_name": f"{name}.jsonl", **shape.entry}
            converted[f"{name}.jsonl"] = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in shape.converted)
        chosen[key].append(name)
        print(f"mpskit: {key} {path}: {shape.said()}, registered as '{name}'", file=sys.stderr)
        if line:
            print(f"mpskit: {line}", file=sys.stderr)
    return entries, converted, chosen


def registration_folder(entries: dict, converted: dict, keep: bool = False) -> Path:
    """A private folder holding a dataset_info.json of these entries and the CONVERTED files, for the
    checks and the plan, removed at exit (a run writes its own into its folder); with KEEP it stays
    (`mpskit config`)."""
    try:
        folder = private_folder("mpskit-data-", keep)
        for name, text in converted.items():
            write_atomic(folder / name, text)
        write_atomic(folder / DATASET_INFO, dataset_info_text(entries))
    except OSError as err:
        raise MpskitError(
            f"cannot register the data files in {tempfile.gettempdir()} ({err.strerror})",
            "set TMPDIR to a folder you can write",
        ) from None
    return folder


def dataset_info_text(entries: dict) -> str:
    return json.dumps(entries, indent=2, ensure_ascii=False) + "\n"


def row_counts(entries: dict) -> dict[str, int]:
    """Each registered file's rows, recorded with the run: a file that moves is checked against them
    (a converted file is the run folder's own)."""
    return {name: len(read_rows(Path(entry["file_name"])))
            for name, entry in entries.items() if Path(entry["file_name"]).is_absolute()}  # fmt: skip


def moved_to(entries: dict, rows: dict, args: dict, new_paths: dict[str, str], run: Path) -> dict:
    """The run's entries with the files NEW_PATHS names (dataset=/eval_dataset=, as many files as the
    run registered for that key, in its order) in place of the registered ones; then each file the
    run reads checked to be there."""
    entries = {name: dict(entry) for name, entry in entries.items()}
    for key, value in new_paths.items():
        names, paths = split_names(args.get(key)), split_names(value)
        if not entries or not names:
            raise MpskitError(f"{key}={value}: the run {run} reads no plain data file as {key}",
                              f"resume it as it is: mpskit train --resume {run}")  # fmt: skip
        if len(paths) != len(names):
            registered = ", ".join(entries[name]["file_name"] for name in names)
            raise MpskitError(f"{key}={value} names {len(paths)} file(s); the run registered {registered}",
                              f"give {len(names)} path(s), comma-separated, in that order")  # fmt: skip
        for name, given in zip(names, paths, strict=True):
            if not Path(entries[name]["file_name"]).is_absolute():
                raise MpskitError(f"{key}={value}: the run trains on its own converted copy of its data",
                                  f"resume it as it is: mpskit train --resume {run}")  # fmt: skip
            path = Path(given).expanduser().absolute()
            entries[name]["file_name"] = _same_data(path, entries[name], rows.get(name), str(args.get("stage", "sft")))
    for key in ("dataset", "eval_dataset"):
        for name in split_names(args.get(key)):
            gone = entries.get(name, {}).get("file_name")
            if gone and Path(gone).is_absolute() and not Path(gone).is_file():
                fix = f"resume with it where it is now: mpskit train --resume {run} {key}=NEWPATH"
                raise MpskitError(f"{gone} is gone: the run trained on it as {key}", fix)
    return entries


def _same_data(path: Path, entry: dict, rows: int | None, stage: str) -> str:
    """PATH, where STAGE reads it as the run registered ENTRY, with ROWS rows (not counted in a run
    recorded before mpskit counted them)."""
    if not path.is_file():
        raise MpskitError(f"{path}: no such file", "give the file's path where it is now")
    shape, _ = for_stage(read_shape(read_rows(path), str(path)), stage, stage_of(stage).rows, str(path))
    if {**shape.entry, "file_name": ""} != {**entry, "file_name": ""}:
        raise MpskitError(f"{path} reads as {shape.words}, not in the columns the run registered for "
                          f"{entry['file_name']}", "give the file the run trained on")  # fmt: skip
    if rows is not None and shape.rows != rows:
        raise MpskitError(f"{path} holds {shape.rows} rows; the run trained on {rows}",
                          "give the file the run trained on, or train a new run on this one")  # fmt: skip
    return str(path)
