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

from mpskit import lf, planner
from mpskit.errors import MpskitError, warn
from mpskit.foodpo import split_foodpo_args
from mpskit.hardware import installed_version
from mpskit.memory import GB
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


def prepare(run: ResolvedRun) -> planner.Plan | None:
    """All checks that need no torch (model, datasets, fooDPO settings), then the memory plan, whose
    choice of the free knobs goes into the run's arguments. No plan when the model's dims are unknown."""
    check_model(str(run.args["model_name_or_path"]))
    check_datasets(run.args)
    if run.stage == "foodpo":
        split_foodpo_args(run.args)  # fail on bad fooDPO settings before anything loads
    run.args = absolute_paths(run.args)
    try:
        memory_plan = planner.plan_run(run)
    except MpskitError as err:
        warn(f"no memory plan: {err.problem}")
        return None
    if not memory_plan.fits:
        need = memory_plan.asked.estimate.training / GB
        raise MpskitError(
            f"no setting fits: the run needs about {need:.1f} GB, the budget is "
            f"{memory_plan.budget.training_bytes / GB:.1f} GB ({memory_plan.budget.why})",
            "what would fit: " + "; ".join(memory_plan.would_fit[1:]) + " (see `mpskit plan`)",
        )
    planner.apply(run, memory_plan)
    return memory_plan


def write_run_dir(run: ResolvedRun, env: dict[str, str], command: list[str], memory_plan=None) -> Path:
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
        "memory": memory_record(memory_plan),
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


def memory_record(memory_plan: planner.Plan | None) -> dict:
    if memory_plan is None:
        return {}
    return {
        "predicted": memory_plan.chosen.estimate.as_dict(),
        "budget_gb": round(memory_plan.budget.training_bytes / GB, 3),
        "budget": memory_plan.budget.why,
        "planner_changes": memory_plan.changes,
    }


def record_measured(run_dir: Path, measured: dict, samples: list[tuple[float, int]]) -> None:
    """Predicted vs measured peak into mpskit.json, and memory.png."""
    from mpskit.plots import plot_memory

    record_file = run_dir / "mpskit.json"
    record = json.loads(record_file.read_text(encoding="utf-8"))
    memory = record.setdefault("memory", {})
    memory["measured"] = measured
    predicted = memory.get("predicted", {}).get("training_gb")
    if predicted and measured["training_gb"] > 0:
        memory["error"] = round((predicted - measured["training_gb"]) / measured["training_gb"], 4)
    record_file.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    plot_memory(run_dir, samples, measured, predicted, memory.get("budget_gb"))


def train(run: ResolvedRun, command: list[str] | None = None) -> Path:
    """Run one training job end to end; returns the run directory."""
    memory_plan = prepare(run)
    env = export_environment(run)
    if run.hide_mps:
        hide_accelerators()
    lf.check_keys(run.args)
    run_dir = write_run_dir(run, env, command or sys.argv, memory_plan)
    print(f"mpskit: run directory {run_dir}", file=sys.stderr)
    for note in memory_plan.changes if memory_plan else []:
        print(f"mpskit: planner: {note}", file=sys.stderr)
    lf.import_engine()
    from mpskit.monitor import MemoryMonitor

    monitor = MemoryMonitor(run.device)  # after the imports: its baseline excludes the framework
    try:
        lf.run(run.args, callbacks=[monitor])
    finally:
        record_measured(run_dir, monitor.stop(), monitor.samples)
    return run_dir
