"""The user's run file and command-line words, read the way `llamafactory-cli train` reads them.

llamafactory-cli has two modes (`read_args` in llamafactory/hparams/parser.py):
- a run file (.yaml, .yml or .json) then `key=value` words: file and words through OmegaConf, so `1e-4`
  is a number and `no` a boolean, and the values reach the argument classes as they are;
- no run file: `--key value`, `--key=value` and bare `--flag` words through HfArgumentParser, which
  types each value by its argument class (`--run_name 123` stays text, a bare `--do_train` is true).
mpskit reads both the same way, and also takes `key=value` words without a run file (read like
`--key value`) and `--key value` words after one (read like `key=value`), which llamafactory-cli
refuses. Typing by the argument classes needs LLaMA-Factory's import, so `config` and `train` do it
(`lf.typed_words`) and `plan` reads the text as a YAML scalar, which gives the same numbers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mpskit.errors import MpskitError
from mpskit.presets import MAX_YAML_BYTES, load_yaml

RUN_FILE_SUFFIXES = (".yaml", ".yml", ".json")
KEY_VALUE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*=")


@dataclass
class RunWords:
    """What the words after `mpskit train|config|plan` say."""

    values: dict  # the user's layer of the run: run file, then words
    word_texts: dict[str, str | None] = field(default_factory=dict)  # no run file: each word's text (None: bare)
    hardware: str | None = None
    output: str | None = None
    run_file: str | None = None


def read_run_words(words: list[str]) -> RunWords:
    run_file, hardware, output, rest = _split(words)
    texts = word_texts(rest)
    if run_file is None:
        return RunWords({key: _scalar(text) for key, text in texts.items()}, texts, hardware, output)
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    dotlist = [f"{key}={'true' if text is None else text}" for key, text in texts.items()]
    try:
        merged = OmegaConf.merge(OmegaConf.create(read_run_file(Path(run_file))), OmegaConf.from_cli(dotlist))
        values = OmegaConf.to_container(merged)
    except (OmegaConfBaseException, ValueError) as err:
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise MpskitError(f"cannot merge {run_file} with {' '.join(rest)}: {first_line}", "fix the value") from err
    return RunWords(values, {}, hardware, output, run_file)


def _split(words: list[str]) -> tuple[str | None, str | None, str | None, list[str]]:
    """(run file, --hardware, -o, the rest). Like llamafactory-cli, a run file is the first word only."""
    run_file = hardware = output = None
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        name, sep, value = word.partition("=")
        if name in ("--hardware", "-o", "--output"):
            if not sep:
                if i + 1 >= len(words):
                    raise MpskitError(f"{name} needs a value", f"write {name} VALUE")
                value = words[i + 1]
                i += 1
            if name == "--hardware":
                hardware = value
            else:
                output = value
        elif run_file is None and not rest and word.endswith(RUN_FILE_SUFFIXES) and not word.startswith("-") \
                and not KEY_VALUE.match(word):  # preset=PATH.yaml is a setting wherever it stands
            run_file = word
        else:
            rest.append(word)
        i += 1
    return run_file, hardware, output, rest


def word_texts(items: list[str]) -> dict[str, str | None]:
    """`key=value`, `--key value`, `--key=value` and bare `--flag` words: each key's text, None for a
    bare flag (a flag is bare when the next word is another option, a `key=value` word, or none)."""
    result: dict[str, str | None] = {}
    i = 0
    while i < len(items):
        word = items[i]
        if word.startswith("--"):
            key, sep, value = word[2:].partition("=")
            text: str | None = value if sep else None
            if not sep and i + 1 < len(items) and not _is_option(items[i + 1]):
                text = items[i + 1]
                i += 1
        else:
            key, sep, text = word.partition("=")
            if not sep:
                raise MpskitError(f"argument '{word}' is not key=value", f"write {word}=VALUE")
        key = key.replace("-", "_")
        if not key:
            raise MpskitError(f"argument '{word}' has an empty key", "write key=value")
        result[key] = text
        i += 1
    return result


def _is_option(word: str) -> bool:
    return word.startswith("--") or bool(KEY_VALUE.match(word))


def _scalar(text: str | None):
    """A word's value without its argument class: a YAML scalar, as HfArgumentParser would type it for
    numbers and true/false; other words (`no`, `on`, lists) stay text."""
    if text is None:
        return True
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
        return text
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads 5e-3 as text; a command line means the number
        except ValueError:
            return value
    return value if isinstance(value, str | int | float | bool) or value is None else text


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object, refused when it gives a key twice (json keeps the last one without a word)."""
    keys = [key for key, _ in pairs]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        raise KeyError(twice)
    return dict(pairs)


def read_run_file(path: Path) -> dict:
    """A YAML or JSON run file's mapping, read as llamafactory-cli reads it (through OmegaConf)."""
    if path.suffix != ".json":
        if isinstance(load_yaml(path).get("args"), dict):  # mpskit's checks: a regular file, a mapping, no bomb
            raise MpskitError(f"{path} is a preset (its settings sit under args:), not a run file",
                              f"name it as one: preset={path}")  # fmt: skip
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.load(path))
    if not path.is_file() or path.stat().st_size > MAX_YAML_BYTES:
        raise MpskitError(f"cannot read {path} (missing, not a file, or over 1 MB)", "give a JSON object file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
    except RecursionError:
        raise MpskitError(f"{path} nests values deeper than Python reads", 'write a flat {"key": value} file') from None
    except KeyError as err:
        raise MpskitError(f"{path} gives the key {err.args[0]} twice", "keep one of them") from None
    except (UnicodeDecodeError, PermissionError) as err:
        raise MpskitError(f"cannot read {path} ({type(err).__name__})", "give a readable JSON file") from err
    except json.JSONDecodeError as err:
        raise MpskitError(f"{path} is not valid JSON at line {err.lineno}", "fix the syntax") from err
    if not isinstance(data, dict):
        raise MpskitError(f"{path} holds a {type(data).__name__}, not an object", 'write it as {"key": value}')
    return data
