"""YAML presets (configs/stages, configs/models, configs/hardware) and the user's own choices.

Plain files in, plain dicts out. Later layers win; the user's explicit values always win.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.resources
import os
import re
from pathlib import Path

import yaml

from mpskit.errors import MpskitError
from mpskit.files import MAX_YAML_NODES, expands_past


def config_dir() -> Path:
    """The presets: $MPSKIT_CONFIG_DIR (a user's own folder), else the ones shipped in the package
    (`configs/` at the repository's root links there)."""
    return Path(os.environ.get("MPSKIT_CONFIG_DIR") or str(importlib.resources.files("mpskit") / "configs"))


def demo_data_dir() -> Path:
    """The demo datasets and their dataset_info.json, shipped in the package (`data/` links there)."""
    return Path(str(importlib.resources.files("mpskit") / "data"))


MAX_YAML_BYTES = 1024**2  # a run file or preset is a few KB; anything this large is not one
# YAML 1.2 floats: PyYAML (YAML 1.1) reads 1e-4 as text, LLaMA-Factory's OmegaConf as 0.0001.
FLOAT = r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"


class _SafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader that reads 1e-4 as a number, as YAML 1.2 and LLaMA-Factory do, and refuses a key
    given twice in one mapping, as LLaMA-Factory's reader (OmegaConf) does."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key_node.value} is given twice", key_node.start_mark
                )
            seen.add(getattr(key_node, "value", None))
        return super().construct_mapping(node, deep)


_SafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(FLOAT), list("-+0123456789."))


def load_yaml(path: Path) -> dict:
    """A YAML file of key: value lines, checked; parsed once per version of the file in a process (the
    planner's searches read the same presets thousands of times), a copy each time."""
    path = Path(path)
    if not path.exists():
        raise MpskitError(f"{path} does not exist", "check the path")
    if not path.is_file() or path.stat().st_size > MAX_YAML_BYTES:
        what = "not a regular file" if not path.is_file() else f"larger than {MAX_YAML_BYTES // 1024} KB"
        raise MpskitError(f"cannot read {path} ({what})", "give a YAML file of key: value lines")
    info = path.stat()
    return copy.deepcopy(_parsed(path, info.st_mtime_ns, info.st_size))


@functools.lru_cache(maxsize=256)
def _parsed(path: Path, mtime_ns: int, size: int) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (PermissionError, UnicodeDecodeError) as err:
        raise MpskitError(f"cannot read {path} ({type(err).__name__})", "give a readable YAML file") from err
    try:
        data = yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or ""
        detail = f": {problem}" if problem else ""
        fix = "keep one of them" if "given twice" in problem else "fix the syntax (indentation, colons)"
        raise MpskitError(f"{path} is not valid YAML{where}{detail}", fix) from err
    except RecursionError:
        raise MpskitError(f"{path} nests values deeper than Python reads", "write a flat key: value file") from None
    if expands_past(data):
        raise MpskitError(f"{path} expands past {MAX_YAML_NODES} values (nested aliases)", "write the values out")
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


PRESET_KINDS = ("stages", "models", "hardware")


def preset_descriptions(kind: str) -> list[tuple[str, str]]:
    """(name, its one-line description) for each preset of a kind, for `mpskit ls`."""
    files = {name: config_dir() / kind / f"{name}.yaml" for name in preset_names(kind)}
    return [(name, str(load_yaml(path).get("description", ""))) for name, path in files.items()]


def preset_model_dir() -> Path:
    """Where the `tiny` model preset (configs/models/tiny.yaml) finds the demo model: its one home."""
    return Path(load_yaml(config_dir() / "models" / "tiny.yaml")["args"]["model_name_or_path"])


def model_folder(preset: str) -> Path:
    """Where a model preset's model lives (a fetchable one's: `mpskit get-model`): its model_name_or_path,
    `~` expanded."""
    data = load_yaml(resolve_preset_file("models", preset))
    return Path(str(data["args"]["model_name_or_path"])).expanduser()


def fetched_model(preset: str, needed_by: str) -> Path:
    """A fetchable preset's model folder, or one line saying what NEEDED_BY it and the command that
    fetches it."""
    folder = model_folder(preset)
    if not (folder / "config.json").is_file():
        raise MpskitError(f"{needed_by}, and it is not in {folder}", f"fetch it once: mpskit get-model {preset}")
    return folder


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


def merge(*layers: dict) -> dict:
    """Flat merge, later layers win."""
    merged: dict = {}
    for layer in layers:
        merged.update(layer)
    return merged
