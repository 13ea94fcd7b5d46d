"""Plain data files as datasets: `dataset=path/to/train.jsonl` or `dataset=DIR` (train and valid files).

LLaMA-Factory reads datasets only through a dataset_info.json entry. mpskit writes that entry for a
plain JSON or JSON Lines file, its format told by the first row's columns, as mlx-lm's `--data DIR`
does: alpaca (instruction/input/output, prompt/completion, prompt/response), messages or
conversations (sharegpt), prompt/chosen/rejected pairs, KTO rows (prompt/completion/label), text.
The entries go to a dataset_info.json of mpskit's own (never the package's or the user's): under the
temporary folder for the checks and the plan, and into the run folder for the run itself
(recipes/train.py). No torch import.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.inputs.dataset_checks import NOT_A_FILE, read_rows
from mpskit.rundir import DATASET_INFO, write_atomic
from mpskit.temporary import private_folder

SUFFIXES = (".jsonl", ".json")
TRAIN_NAMES = ("train",)
VALID_NAMES = ("valid", "validation", "val", "eval", "test")
ROLE_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
             "system_tag": "system"}  # fmt: skip


def _is_path(name: str) -> bool:
    return name.endswith(SUFFIXES) or os.sep in name or Path(name).expanduser().exists()


def _split_names(value) -> list[str]:
    return [name.strip() for name in str(value or "").split(",") if name.strip()]


def _turns_tags(turns) -> dict:
    """sharegpt tags for turns of {role, content} (OpenAI's messages); {} for {from, value}."""
    first = turns[0] if isinstance(turns, list) and turns and isinstance(turns[0], dict) else {}
    return {"tags": dict(ROLE_TAGS)} if "role" in first else {}


def detect_format(path: Path) -> tuple[dict, str]:
    """(the dataset_info.json entry, the format in words) for a file, from its first row's columns."""
    rows = read_rows(path)
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    columns = set(first)
    entry: dict = {"file_name": str(path)}
    if "messages" in columns or "conversations" in columns:
        key = "messages" if "messages" in columns else "conversations"
        entry |= {"formatting": "sharegpt", "columns": {"messages": key}, **_turns_tags(first[key])}
        return entry, f"{key} (sharegpt)"
    prompt = next((key for key in ("instruction", "prompt", "question") if key in columns), None)
    query = {"query": "input"} if "input" in columns else {}
    system = {"system": "system"} if "system" in columns else {}
    if prompt and {"chosen", "rejected"} <= columns:
        entry |= {"ranking": True, "columns": {"prompt": prompt, **query, "chosen": "chosen", "rejected": "rejected",
                                               **system}}  # fmt: skip
        return entry, f"preference pairs ({prompt}, chosen, rejected)"
    response = next((key for key in ("output", "completion", "response", "answer") if key in columns), None)
    tag = next((key for key in ("label", "kto_tag") if key in columns), None)
    if prompt and response and tag:
        entry |= {"columns": {"prompt": prompt, **query, "response": response, "kto_tag": tag, **system}}
        return entry, f"KTO ({prompt}, {response}, {tag})"
    if prompt and response:
        entry |= {"columns": {"prompt": prompt, **query, "response": response, **system}}
        return entry, f"alpaca ({', '.join([prompt, *query.values(), response])})"
    if "text" in columns:
        entry |= {"columns": {"prompt": "text"}}
        return entry, "plain text (text)"
    raise MpskitError(
        f"cannot tell the format of {path} from its columns ({', '.join(sorted(columns)) or 'none'})",
        "give instruction/input/output, prompt/completion, messages, prompt/chosen/rejected or text columns, "
        "or register it in a dataset_info.json of your own (dataset_dir=...)",
    )


def _split_file(folder: Path, names: tuple[str, ...]) -> Path | None:
    found = [folder / f"{name}{suffix}" for name in names for suffix in SUFFIXES]
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


def register_plain_data(user: dict) -> tuple[dict, dict]:
    """(the user's settings with plain files replaced by registered names and dataset_dir, the entries);
    unchanged and {} when the datasets are names. A folder's valid file is the eval_dataset unless the
    user gives one or a val_size."""
    given = {key: _split_names(user.get(key)) for key in ("dataset", "eval_dataset")}
    paths = {key: [name for name in names if _is_path(name)] for key, names in given.items()}
    if not any(paths.values()):
        return user, {}
    for key, names in given.items():
        if paths[key] and len(paths[key]) != len(names):
            raise MpskitError(
                f"{key}={user[key]} mixes files with dataset names",
                "give files only (they are registered for the run), or register them all in a dataset_info.json",
            )
    if paths["dataset"] and "dataset_dir" in user:
        raise MpskitError(
            f"dataset={user['dataset']} is a file, so dataset_dir={user['dataset_dir']} is not read",
            "leave out dataset_dir, or name a dataset of its dataset_info.json",
        )
    with_valid = not (user.get("eval_dataset") or user.get("val_size"))  # the user's evaluation wins
    files = [pair for key, names in paths.items() for name in names for pair in _files(name, key, with_valid)]
    entries, chosen = {}, {"dataset": [], "eval_dataset": []}
    for key, path in files:
        name = _entry_name(path, set(entries))
        entries[name], words = detect_format(path)
        chosen[key].append(name)
        print(f"mpskit: {key} {path}: {words}, registered as '{name}'", file=sys.stderr)
    user = dict(user)
    for key, names in chosen.items():
        if names:
            user[key] = ",".join(names)
    if chosen["eval_dataset"] and not paths["eval_dataset"] and "eval_strategy" not in user:
        user["eval_strategy"] = "epoch"  # a folder's valid file is there to be evaluated on, as in mlx-lm
    user["dataset_dir"] = str(registration_folder(entries))
    return user, entries


def registration_folder(entries: dict, keep: bool = False) -> Path:
    """A private folder holding a dataset_info.json of these entries, for the checks and the plan,
    removed at exit (a run writes its own into its folder); with KEEP it stays (`mpskit config`)."""
    try:
        folder = private_folder("mpskit-data-", keep)
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
    """Each registered file's rows, recorded with the run: a file that moves is checked against them."""
    return {name: len(read_rows(Path(entry["file_name"]))) for name, entry in entries.items()}


def moved_to(entries: dict, rows: dict, args: dict, new_paths: dict[str, str], run: Path) -> dict:
    """The run's entries with the files NEW_PATHS names (dataset=/eval_dataset=, as many files as the
    run registered for that key, in its order) in place of the registered ones; then each file the
    run reads checked to be there."""
    entries = {name: dict(entry) for name, entry in entries.items()}
    for key, value in new_paths.items():
        names, paths = _split_names(args.get(key)), _split_names(value)
        if not entries or not names:
            raise MpskitError(f"{key}={value}: the run {run} reads no plain data file as {key}",
                              f"resume it as it is: mpskit train --resume {run}")  # fmt: skip
        if len(paths) != len(names):
            registered = ", ".join(entries[name]["file_name"] for name in names)
            raise MpskitError(f"{key}={value} names {len(paths)} file(s); the run registered {registered}",
                              f"give {len(names)} path(s), comma-separated, in that order")  # fmt: skip
        for name, given in zip(names, paths, strict=True):
            entries[name]["file_name"] = _same_data(Path(given).expanduser().absolute(), entries[name], rows.get(name))
    for key in ("dataset", "eval_dataset"):
        for name in _split_names(args.get(key)):
            gone = entries.get(name, {}).get("file_name")
            if gone and not Path(gone).is_file():
                fix = f"resume with it where it is now: mpskit train --resume {run} {key}=NEWPATH"
                raise MpskitError(f"{gone} is gone: the run trained on it as {key}", fix)
    return entries


def _same_data(path: Path, entry: dict, rows: int | None) -> str:
    """PATH, where it holds data of ENTRY's format and ROWS rows (not counted in a run recorded before
    mpskit counted them)."""
    if not path.is_file():
        raise MpskitError(f"{path}: no such file", "give the file's path where it is now")
    found, words = detect_format(path)
    if {**found, "file_name": ""} != {**entry, "file_name": ""}:
        raise MpskitError(f"{path} reads as {words}, not in the columns the run registered for {entry['file_name']}",
                          "give the file the run trained on")  # fmt: skip
    count = len(read_rows(path))
    if rows is not None and count != rows:
        raise MpskitError(f"{path} holds {count} rows; the run trained on {rows}",
                          "give the file the run trained on, or train a new run on this one")  # fmt: skip
    return str(path)
