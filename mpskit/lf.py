"""The bridge to LLaMA-Factory: its argument names, its YAML, its own run_exp.

Importing this module is cheap; each function imports LLaMA-Factory (and so torch) when called, so
callers can set the environment and hide devices first.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

import yaml

from mpskit.errors import MpskitError


def known_keys() -> set[str]:
    """Every key `llamafactory-cli train` accepts, read from LLaMA-Factory's own argument classes."""
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )

    classes = (ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments)
    return {f.name for cls in classes for f in dataclasses.fields(cls) if f.init}


def check_keys(args: dict, extra_allowed: tuple[str, ...] = ()) -> None:
    """Fail on the first key LLaMA-Factory does not know, with the closest known key as a hint."""
    keys = known_keys() | set(extra_allowed)
    for key in args:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see `llamafactory-cli train -h` for the keys"
            raise MpskitError(f"unknown key '{key}'", hint)


def write_yaml(args: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(args, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def run(args: dict, callbacks: list | None = None) -> None:
    """Train through LLaMA-Factory's own entry point, exactly as `llamafactory-cli train` does."""
    from llamafactory.train.tuner import run_exp

    run_exp(dict(args), callbacks=callbacks or [])
