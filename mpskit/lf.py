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
from mpskit.memory import LEAN_STAGES

# mpskit's own run key for the lean-logits path: kept out of the written YAML, which must also run
# under plain `llamafactory-cli train` (where the plain path runs), and recorded in mpskit.json.
LEAN_KEY = "lean_logits"


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

    keys = known_keys() | {LEAN_KEY} | (set(FOODPO_KEYS) if args.get("stage") == "foodpo" else set())
    for key in args:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see `llamafactory-cli train -h` for the keys"
            raise MpskitError(f"unknown key '{key}'", hint)


def yaml_text(args: dict) -> str:
    """llamafactory.yaml's text: every argument but mpskit's lean-logits switch."""
    kept = {key: value for key, value in args.items() if key != LEAN_KEY}
    return yaml.safe_dump(kept, sort_keys=False, allow_unicode=True)


def write_yaml(args: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml_text(args), encoding="utf-8")
    return path


def import_engine():
    """Import LLaMA-Factory's training entry point (and with it torch, transformers, peft, trl)."""
    from llamafactory.train.tuner import run_exp

    return run_exp


def run(args: dict, callbacks: list | None = None) -> dict:
    """Train through LLaMA-Factory's own entry point, exactly as `llamafactory-cli train` does.

    Narrow swaps first: trainer_log.jsonl keeps every logged metric; the SFT and DPO workflows build
    mpskit's lean-logits trainers (LLaMA-Factory's own, with one method replaced); `stage: foodpo`
    becomes LLaMA-Factory's DPO workflow building the fooDPO trainer. Returns what the lean-logits
    switch did (for mpskit.json).
    """
    from mpskit import lean_trainers, trainer_log

    run_exp = import_engine()

    trainer_log.install()
    args = dict(args)
    lean = lean_trainers.LeanPath(bool(args.pop(LEAN_KEY, True)) and args.get("stage") in LEAN_STAGES)
    is_foodpo = args.get("stage") == "foodpo"
    if is_foodpo:
        from mpskit.foodpo import split_foodpo_args
        from mpskit.foodpo_trainer import FooDPOTrainer

        args, config = split_foodpo_args(args)
        lean_trainers.install(lean, FooDPOTrainer, foodpo=config)
    else:
        lean_trainers.install(lean)
    run_exp(args, callbacks=callbacks or [])
    if is_foodpo and args.get("output_dir"):
        from mpskit.plots import plot_foodpo

        plot_foodpo(args["output_dir"])
    return lean.report
