"""The datasets a run names, opened and checked against dataset_info.json before anything is created.

LLaMA-Factory reads them minutes later, after the model has loaded, and a bad file ends there as a
traceback from `datasets` (or as "Cannot find valid samples"). Here each problem is one line that
names the file, the row and the column. Local JSON and JSON Lines files are read whole (as
LLaMA-Factory will); other formats, folders and hub datasets are left to LLaMA-Factory.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from pathlib import Path

from mpskit.errors import MpskitError, warn
from mpskit.files import read_json
from mpskit.stages import stage_of

NOT_A_FILE = "which is not a regular file (a FIFO, a device, a socket)"


def split_names(value) -> list[str]:
    """The names of a `dataset` or `eval_dataset` value, as LLaMA-Factory splits them."""
    return [name.strip() for name in str(value or "").split(",") if name.strip()]


def dataset_names(args: dict) -> list[str]:
    return [*split_names(args.get("dataset")), *split_names(args.get("eval_dataset"))]


def check_datasets(args: dict, rows: bool = True) -> None:
    """Every dataset named in dataset/eval_dataset is in dataset_dir/dataset_info.json, fits the stage,
    and (with `rows`, which reads whole files) its local file holds examples with the columns its
    entry names."""
    names = dataset_names(args)
    if not names:
        raise MpskitError("no dataset given", "set dataset=NAME (a name from data/dataset_info.json)")
    stage = str(args.get("stage", "sft"))
    dataset_dir = Path(str(args.get("dataset_dir", "data")))
    info_file = dataset_dir / "dataset_info.json"
    if not info_file.is_file():
        raise MpskitError(f"{info_file} not found", "set dataset_dir to the folder that holds dataset_info.json")
    try:
        info = read_json(info_file)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MpskitError(f"{info_file} is not valid JSON", "fix the file") from err
    except RecursionError:
        raise MpskitError(f"{info_file} nests values deeper than Python reads",
                          'map each dataset name to {"file_name": ...}') from None
    if not isinstance(info, dict):
        raise MpskitError(f"{info_file} holds a {type(info).__name__}, not a mapping", "map each dataset name to {...}")
    for name in names:
        if name not in info:
            raise MpskitError(
                f"dataset '{name}' is not in {info_file}", f"add it there or use one of {', '.join(sorted(info))}"
            )
        entry = info[name]
        if not isinstance(entry, dict):
            raise MpskitError(f"dataset '{name}' in {info_file} is not a mapping", 'write {"file_name": ...}')
        _check_stage(name, entry, stage)
        file_name = entry.get("file_name")
        if file_name:
            path = dataset_dir / str(file_name)
            if not path.exists():
                raise MpskitError(f"dataset '{name}' points at {path}, which does not exist", "fix file_name")
            if not (path.is_file() or path.is_dir()):
                raise MpskitError(f"dataset '{name}' points at {path}, {NOT_A_FILE}", "point file_name at a data file")
            data = [path] if path.is_file() else [child for child in path.iterdir() if child.is_file()]
            if not data:
                raise MpskitError(f"dataset '{name}' points at {path}, an empty folder",
                                  "point file_name at a data file, or a folder of them")  # fmt: skip
            if odd := next((file for file in data if file.suffix.lstrip(".") not in LOADABLE), None):
                raise MpskitError(f"dataset '{name}' points at {odd}, which LLaMA-Factory does not read as data "
                                  f"(it reads {', '.join(LOADABLE)})", "point file_name at a data file")  # fmt: skip
            if rows and path.is_file() and path.suffix in (".json", ".jsonl"):
                _check_rows(path, read_rows(path), required_columns(entry, stage))
    check_val_size(args, rows)


LOADABLE = ("arrow", "csv", "json", "jsonl", "parquet", "txt")  # the file types LLaMA-Factory's loader reads


def check_val_size(args: dict, rows: bool = True) -> None:
    """val_size as LLaMA-Factory splits with it: a share in [0, 1) or a number of rows above 1 that
    leaves rows to train on (with `rows`, which reads the files), and never beside an eval_dataset."""
    text = args.get("val_size")
    if text is None:
        return
    try:
        size = float(text)
    except (TypeError, ValueError):
        size = math.nan
    fix = "set val_size to a share below 1 (0.1) or a number of rows (50), or leave it out"
    if not math.isfinite(size) or size < 0 or size == 1:
        raise MpskitError(f"val_size={text} is not a share in [0, 1) or a number of rows above 1", fix)
    if size > 1e-6 and args.get("eval_dataset"):
        raise MpskitError(
            f"val_size={text} beside eval_dataset={args['eval_dataset']} (LLaMA-Factory takes one or the other)",
            "leave out val_size or eval_dataset",
        )
    total = training_rows(args) if rows else None
    held_out = math.ceil(size * total) if total and size < 1 else int(size)
    if total is not None and held_out >= total:
        raise MpskitError(f"val_size={text} holds out {held_out} of the {total} training rows, leaving none", fix)


CONVERTED_ROWS = 5000  # rows of each file put through LLaMA-Factory's converter before a run


def check_conversion(args: dict) -> None:
    """Rows of each local JSON / JSON Lines dataset through LLaMA-Factory's own converter, as its data
    loader will put them (imports LLaMA-Factory). A row it cannot convert, or whose text is not text,
    is one line; rows its processor would drop are said, and a file where it would drop all is refused.
    The converter's own warning for each odd row is not shown: mpskit's lines count them."""
    converter_log = logging.getLogger("llamafactory.data.converter")
    level = converter_log.level
    converter_log.setLevel(logging.ERROR)
    try:
        _check_conversion(args)
    finally:
        converter_log.setLevel(level)


def _check_conversion(args: dict) -> None:
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import get_dataset_list
    from llamafactory.hparams import DataArguments

    dataset_dir = str(args.get("dataset_dir", "data"))
    stage = str(args.get("stage", "sft"))
    data_args = DataArguments(dataset_dir=dataset_dir, media_dir=str(args.get("media_dir") or dataset_dir))
    info = read_json(Path(dataset_dir) / "dataset_info.json")
    for attr in get_dataset_list(dataset_names(args), info):
        path = Path(dataset_dir) / attr.dataset_name
        if attr.load_from != "file" or not path.is_file() or path.suffix not in (".json", ".jsonl"):
            continue
        converter = get_dataset_converter(attr.formatting, attr, data_args)
        rows = read_rows(path)[:CONVERTED_ROWS]
        columns = dict.fromkeys(key for row in rows for key in row)  # `datasets` gives each row every column
        dropped, same, empty = [], [], []
        for number, row in enumerate(rows, start=1):
            try:
                example = converter({**columns, **row})
            except KeyError as err:
                if err.args[0] is None:  # a column the entry names no source for (a ranking entry's chosen)
                    raise MpskitError(
                        f"the dataset_info.json entry of {path} ({attr.formatting}"
                        f"{', ranking' if attr.ranking else ''}) maps no column for a part LLaMA-Factory reads",
                        'add its "columns" to the entry, as {"prompt": "instruction", "chosen": "chosen", '
                        '"rejected": "rejected"} for alpaca pairs',
                    ) from None
                raise MpskitError(
                    f"{path} has no '{err.args[0]}' column, which LLaMA-Factory's {attr.formatting} format reads",
                    "add it to the rows, or map the columns in dataset_info.json",
                ) from None
            except Exception as err:  # noqa: BLE001 - whatever the converter raises, said as one line
                raise MpskitError(
                    f"{path}: LLaMA-Factory's {attr.formatting} converter cannot read row {number} "
                    f"({type(err).__name__}: {err})",
                    "fix the row, or map its columns in dataset_info.json",
                ) from None
            turns = [*example["_prompt"], *example["_response"]]
            bad = next((turn for turn in turns if not isinstance(turn.get("content"), str)), None)
            if bad is not None:  # a traceback in LLaMA-Factory's template, minutes later
                raise MpskitError(
                    f"{path}: row {number}: a {bad.get('role')} turn holds a {type(bad['content']).__name__}, not text",
                    "give every prompt and answer as a string",
                )
            why = _dropped(example, stage)
            if why:
                dropped.append(f"row {number}: {why}")
            elif stage_of(stage).pairs and example["_response"][0]["content"] == example["_response"][1]["content"]:
                same.append(number)
            elif stage_of(stage).rows == "answer" and not example["_response"][0]["content"].strip():
                empty.append(number)
        if dropped and len(dropped) == len(rows):
            raise MpskitError(f"{path}: LLaMA-Factory would drop every row ({dropped[0]})", "fix the rows")
        if dropped:
            warn(f"{path}: LLaMA-Factory drops {len(dropped)} of {len(rows)} rows ({dropped[0]})")
        if same and len(same) + len(dropped) == len(rows):  # the loss would stay at ln 2: nothing is learnt
            raise MpskitError(f"{path}: every pair's chosen answer is its rejected one", "give pairs that differ")
        if same:
            warn(f"{path}: {len(same)} of {len(rows)} pairs have the same chosen and rejected answer (row {same[0]})")
        if empty and len(empty) + len(dropped) == len(rows):  # no token to learn from: the loss is nan
            raise MpskitError(f"{path}: every answer is empty: nothing to learn", "give the rows their answers")
        if empty:
            warn(f"{path}: {len(empty)} of {len(rows)} rows have an empty answer (row {empty[0]})")


def _dropped(example: dict, stage: str) -> str | None:
    """Why LLaMA-Factory's processor for the stage would drop a converted row; None: it keeps it."""
    if stage_of(stage).rows == "text":
        return None
    if len(example["_prompt"]) % 2 != 1:
        return "the turns before the answer do not end with the user's"
    answers = len(example["_response"])
    if stage_of(stage).rows in ("pairs", "kto") and answers < 2:
        return "no chosen and rejected answer"
    if stage_of(stage).rows == "answer" and answers != 1:
        return "no answer"
    return None


def training_rows(args: dict) -> int | None:
    """Rows of the training datasets (max_samples applies to each, as in LLaMA-Factory), before
    val_size; None when one is not a local JSON or JSON Lines file this can read."""
    dataset_dir = Path(str(args.get("dataset_dir", "data")))
    names = split_names(args.get("dataset"))
    total = 0
    try:
        info = read_json(dataset_dir / "dataset_info.json")
        for name in names:
            path = dataset_dir / str(info[name]["file_name"])
            if path.suffix not in (".json", ".jsonl"):
                return None
            rows = len(read_rows(path))
            total += min(rows, int(args.get("max_samples") or rows))
    except (OSError, ValueError, KeyError, TypeError, MpskitError):
        return None
    return total or None


def _check_stage(name: str, entry: dict, stage: str) -> None:
    ranking = bool(entry.get("ranking"))
    rows = stage_of(stage).rows
    if rows == "pairs" and not ranking:
        raise MpskitError(
            f"dataset '{name}' is not a preference set, which stage {stage} needs",
            'give pairs (chosen, rejected) and "ranking": true in dataset_info.json',
        )
    if rows != "pairs" and ranking:
        raise MpskitError(f"dataset '{name}' is a preference set (ranking: true)", f"give stage {stage} a plain set")
    if rows == "kto" and not (entry.get("columns") or {}).get("kto_tag"):
        raise MpskitError(
            f"dataset '{name}' has no kto_tag column, which stage kto needs",
            'map it in dataset_info.json: "columns": {"kto_tag": "..."} (true: a desirable answer)',
        )


def required_columns(entry: dict, stage: str) -> list[str]:
    """The columns LLaMA-Factory's converters read from each row, by the entry's formatting."""
    columns = entry.get("columns") or {}
    ranking = bool(entry.get("ranking"))
    if entry.get("formatting", "alpaca") == "alpaca":
        needed = [columns.get("prompt", "instruction")]
        if not ranking and stage_of(stage).rows in ("answer", "kto"):
            needed.append(columns.get("response", "output"))
        if stage_of(stage).rows == "kto":
            needed.append(columns["kto_tag"])
    else:
        needed = [columns.get("messages", "conversations")]
    if ranking:
        needed += [columns.get("chosen", "chosen"), columns.get("rejected", "rejected")]
    return needed


def read_rows(path: Path) -> list:
    """A .json file's list of rows, or a .jsonl file's rows (a .json file of JSON Lines too, and a
    byte-order mark before either: LLaMA-Factory's loader reads them so). Parsed once per version of
    the file in a process (a command's checks, shapes, token lengths and counts all read it); the
    rows are shared, so callers read them and change none."""
    if not path.is_file():  # reading a FIFO would wait for a writer
        raise MpskitError(f"{path}, {NOT_A_FILE}", "give a .json or .jsonl file")
    info = path.stat()
    return _read_rows(path, info.st_mtime_ns, info.st_size)


@functools.lru_cache(maxsize=8)
def _read_rows(path: Path, mtime_ns: int, size: int) -> list:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise MpskitError(f"{path} is not UTF-8 text (byte {err.start})", "save it as UTF-8") from err
    if not text.strip():
        raise MpskitError(f"{path} is empty", "give it examples, or name another dataset")
    if path.suffix != ".jsonl":
        try:
            rows = [_parsed(path, 1, text)]
        except MpskitError:
            if not text.lstrip().startswith("{") or len(text.strip().splitlines()) < 2:
                raise
            rows = _lines(path, text)  # JSON Lines in a .json file
        else:
            return _row_list(path, rows[0])
    else:
        rows = _lines(path, text)
    return [row for row in rows if row is not None]


def _lines(path: Path, text: str) -> list:
    return [_parsed(path, number, line) if line.strip() else None for number, line in enumerate(text.splitlines(), 1)]


def _parsed(path: Path, first_line: int, chunk: str):
    try:
        return json.loads(chunk)
    except json.JSONDecodeError as err:
        line = first_line + err.lineno - 1
        raise MpskitError(f"{path} is not valid JSON (line {line}: {err.msg})", "fix the file") from err
    except RecursionError:
        raise MpskitError(f"{path}: line {first_line} nests deeper than JSON readers go", "fix the file") from None


def _row_list(path: Path, rows) -> list:
    if not isinstance(rows, list):
        raise MpskitError(f"{path} holds a {type(rows).__name__}, not a list of examples", "write [{...}, {...}]")
    return rows


def _check_rows(path: Path, rows: list, needed: list[str]) -> None:
    if not rows:
        raise MpskitError(f"{path} holds no examples", "give it examples, or name another dataset")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise MpskitError(f"{path}: row {number} is a {type(row).__name__}, not a mapping", "write {...} rows")
        missing = [column for column in needed if row.get(column) is None]  # a false kto_tag is a value
        if missing:
            raise MpskitError(
                f"{path}: row {number} has no '{missing[0]}' column",
                f"give every row {', '.join(repr(c) for c in needed)} (or map them in dataset_info.json's columns)",
            )
