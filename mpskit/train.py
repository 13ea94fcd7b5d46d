"""The training recipe: check inputs, export the environment, write the run directory, run LLaMA-Factory.

Order matters: the MPS variables and device hiding must be in place before torch is imported, and
every check runs before the run directory is created, so a bad input leaves nothing behind.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

from mpskit import lf
from mpskit.foodpo import split_foodpo_args
from mpskit.hardware import installed_version
from mpskit.mps_env import env_for
from mpskit.resolve import ResolvedRun, absolute_paths, check_datasets, check_model, new_run_dir


def hide_accelerators() -> None:
    """Make torch, transformers, accelerate and LLaMA-Factory see no MPS or CUDA device.

    They all ask `torch.backends.mps.is_available()` / `is_built()` at call time, so replacing those
    two functions before transformers or llamafactory are imported keeps the model, the batches and
    the optimizer state on the CPU. CUDA is hidden the usual way, before torch initialises it.
    """
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.backends.mps.is_available = _no_device
    torch.backends.mps.is_built = _no_device


@functools.lru_cache
def _no_device() -> bool:
    """Stands in for torch's own lru_cache'd checks (torch._dynamo reads their __wrapped__)."""
    return False


def export_environment(run: ResolvedRun) -> dict[str, str]:
    env = {name: value for name, value, _ in env_for(run.hardware)}
    os.environ.update(env)
    return env


def prepare(run: ResolvedRun) -> ResolvedRun:
    """All checks that need no torch: model, datasets; then absolute paths for the written YAML."""
    check_model(str(run.args["model_name_or_path"]))
    check_datasets(run.args)
    if run.stage == "foodpo":
        split_foodpo_args(run.args)  # fail on bad fooDPO settings before anything loads
    run.args = absolute_paths(run.args)
    return run


def write_run_dir(run: ResolvedRun, env: dict[str, str], command: list[str]) -> Path:
    run_dir = new_run_dir(run)
    run_dir.mkdir(parents=True)
    run.args["output_dir"] = str(run_dir.resolve())
    lf.write_yaml(run.args, run_dir / "llamafactory.yaml")
    record = {
        "run_name": run.run_name,
        "stage": run.stage,
        "device": run.device,
        "hardware": run.hardware.as_dict(),
        "layers": run.layers,
        "environment": env,
        "mps_hidden": run.hide_mps,
        "llamafactory_args": run.args,
        "model_dims": run.model_dims,
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "versions": {pkg: installed_version(pkg) for pkg in ("torch", "transformers", "peft", "trl", "llamafactory")},
    }
    (run_dir / "mpskit.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    latest = run_dir.parent / "latest"
    if latest.is_symlink() or not latest.exists():
        if latest.is_symlink():
            latest.unlink()
        latest.symlink_to(run_dir.name)
    return run_dir


def train(run: ResolvedRun, command: list[str] | None = None) -> Path:
    """Run one training job end to end; returns the run directory."""
    prepare(run)
    env = export_environment(run)
    if run.hide_mps:
        hide_accelerators()
    lf.check_keys(run.args)
    run_dir = write_run_dir(run, env, command or sys.argv)
    print(f"mpskit: run directory {run_dir}", file=sys.stderr)
    lf.run(run.args)
    return run_dir
