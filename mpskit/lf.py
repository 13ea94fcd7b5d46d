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


def check_keys(args: dict) -> None:
    """Fail on the first key LLaMA-Factory (or, for stage foodpo, fooDPO) does not know, with a hint."""
    from mpskit.foodpo import FOODPO_KEYS

    keys = known_keys() | (set(FOODPO_KEYS) if args.get("stage") == "foodpo" else set())
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


def import_engine():
    """Import LLaMA-Factory's training entry point (and with it torch, transformers, peft, trl)."""
    from llamafactory.train.tuner import run_exp

    return run_exp


def run(args: dict, callbacks: list | None = None) -> None:
    """Train through LLaMA-Factory's own entry point, exactly as `llamafactory-cli train` does.

    Two narrow swaps first: trainer_log.jsonl keeps every logged metric, and `stage: foodpo` becomes
    LLaMA-Factory's DPO workflow building the fooDPO trainer.
    """
    from mpskit import trainer_log

    run_exp = import_engine()

    trainer_log.install()
    args = dict(args)
    is_foodpo = args.get("stage") == "foodpo"
    if is_foodpo:
        from mpskit import foodpo_trainer
        from mpskit.foodpo import split_foodpo_args

        args, config = split_foodpo_args(args)
        foodpo_trainer.install(config)
    run_exp(args, callbacks=callbacks or [])
    if is_foodpo and args.get("output_dir"):
        from mpskit.plots import plot_foodpo

        plot_foodpo(args["output_dir"])
