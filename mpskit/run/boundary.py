"""The boundary between the libraries and the user: an exception that LLaMA-Factory, transformers,
peft, trl, datasets or torch raise becomes one line, with its whole traceback kept in the run's
train.log (and on stderr with -v). No torch import.

The line names the library and the exception, its own first line of message, and the setting it
concerns where one of the run's arguments (its key or its value) appears in that message.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path

from mpskit.run.quiet import is_verbose, log_lines

LIBRARIES = ("llamafactory", "transformers", "peft", "trl", "datasets", "accelerate", "tokenizers", "safetensors",
             "torch", "bitsandbytes", "huggingface_hub", "yaml", "jinja2")  # fmt: skip
MESSAGE_CHARS = 300


def library_of(err: BaseException) -> str | None:
    """The library whose code raised ERR: the innermost frame's package under site-packages."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        parts = Path(frame.filename).parts
        for name in LIBRARIES:
            if name in parts and "site-packages" in parts[: parts.index(name)]:
                return name
    return None


def named_setting(message: str, args: dict, library: str | None = None) -> str | None:
    """A run argument the message names as a whole word, by its key or by its value (a value of 3
    characters or more: "dataset" is not named by "datasets.py"); for an error of the datasets library
    that names none, the data the run reads."""
    for key, value in args.items():
        if _names(message, key) or (isinstance(value, str) and len(value) >= 3 and _names(message, value)):
            return f"{key}={str(value).lower() if isinstance(value, bool) else value}"
    if library == "datasets" and args.get("dataset"):
        return f"dataset={args['dataset']} (in {args.get('dataset_dir', 'data')})"
    return None


def _names(message: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", message) is not None


def one_line(err: BaseException, args: dict | None = None) -> tuple[str, str | None]:
    """(library (Type): its message's first line, the setting it names or None)."""
    text = str(err).strip().splitlines()
    message = text[0] if text else ""
    message = message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 3] + "..."
    where = library_of(err)
    kind = f"{where} ({type(err).__name__})" if where else type(err).__name__
    return f"{kind}: {message}" if message else kind, named_setting(str(err), args or {}, where)


def keep_traceback(err: BaseException, log_dir: Path | None) -> None:
    """The whole traceback into LOG_DIR's train.log, and on stderr with -v."""
    lines = "".join(traceback.format_exception(err)).rstrip().splitlines()
    if log_dir is not None:
        log_lines(log_dir, ["mpskit: the error in full:", *lines])
    if is_verbose():
        print("\n".join(lines), file=sys.stderr)
