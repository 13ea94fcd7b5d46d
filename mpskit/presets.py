"""YAML presets (configs/stages, configs/models, configs/hardware) and the user's own choices.

Plain files in, plain dicts out. Later layers win; the user's explicit values always win.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import yaml

from mpskit.errors import MpskitError, warn


def config_dir() -> Path:
    """configs/ beside the package (an editable install), or $MPSKIT_CONFIG_DIR."""
    return Path(os.environ.get("MPSKIT_CONFIG_DIR") or Path(__file__).resolve().parent.parent / "configs")


def load_yaml(path: Path) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise MpskitError(f"{path} does not exist", "check the path") from err
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise MpskitError(f"cannot read {path} ({type(err).__name__})", "give a readable YAML file") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise MpskitError(f"{path} is not valid YAML{where}", "fix the syntax (indentation, colons)") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MpskitError(f"{path} holds a {type(data).__name__}, not a mapping", "write it as key: value lines")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise MpskitError(f"{path} has non-text key {bad[0]!r}", "keys must be names such as lora_rank")
    return data


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / kind).glob("*.yaml"))


def resolve_preset_file(kind: str, name_or_path: str) -> Path:
    """A preset name (configs/<kind>/<name>.yaml) or a path to a YAML file."""
    as_path = Path(os.path.expanduser(str(name_or_path)))
    if as_path.suffix in (".yaml", ".yml") or os.sep in str(name_or_path):
        if not as_path.is_file():
            raise MpskitError(f"{kind} file {name_or_path} does not exist", "check the path")
        return as_path
    path = config_dir() / kind / f"{name_or_path}.yaml"
    if path.is_file():
        return path
    names = preset_names(kind)
    close = difflib.get_close_matches(str(name_or_path), names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise MpskitError(f"unknown {kind} preset '{name_or_path}'", f"{hint}known: {', '.join(names)}")


def parse_overrides(items: list[str]) -> dict:
    """`key=value` and `--key value` / `--key=value` words, values read as YAML scalars."""
    result: dict = {}
    i = 0
    while i < len(items):
        word = items[i]
        if word.startswith("--"):
            key, sep, value = word[2:].partition("=")
            if not sep:
                if i + 1 >= len(items) or items[i + 1].startswith("--"):
                    raise MpskitError(f"option --{key} has no value", f"write --{key} VALUE or {key}=VALUE")
                value = items[i + 1]
                i += 1
        else:
            key, sep, value = word.partition("=")
            if not sep:
                raise MpskitError(f"argument '{word}' is not key=value", f"write {word}=VALUE")
        key = key.replace("-", "_")
        if not key:
            raise MpskitError(f"argument '{word}' has an empty key", "write key=value")
        result[key] = _scalar(value)
        i += 1
    return result


def _scalar(text: str):
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
        return text  # YAML 1.1 reads no/yes/on/off as booleans; eval_strategy=no means "no"
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1 reads 5e-3 as text; a command line means the number
        except ValueError:
            return value
    return value if isinstance(value, str | int | float | bool) or value is None else text


def translate_removed_keys(args: dict) -> dict:
    """Rewrite keys transformers no longer accepts, with a one-line warning each."""
    args = dict(args)
    if "no_cuda" in args:
        value = args.pop("no_cuda")
        warn("'no_cuda' was removed from transformers 5; using 'use_cpu' instead")
        if value:
            args.setdefault("use_cpu", True)
    if "use_mps_device" in args:
        args.pop("use_mps_device")
        warn("'use_mps_device' was removed from transformers 5; MPS comes from the hardware profile, key dropped")
    if "gradient_checkpointing" in args:
        value = args.pop("gradient_checkpointing")
        warn(
            "'gradient_checkpointing' is not LLaMA-Factory's switch (it checkpoints by default); "
            "using 'disable_gradient_checkpointing' instead"
        )
        args.setdefault("disable_gradient_checkpointing", not value)
    return args


def merge(*layers: dict) -> dict:
    """Flat merge, later layers win."""
    merged: dict = {}
    for layer in layers:
        merged.update(layer)
    return merged
