"""The checks before a run that read files, the disk or the hub, and the planned run they lead to.

`mpskit config` and `mpskit train` both start here, so they check and plan the same way. No torch.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mpskit import advice
from mpskit.errors import MpskitError, warn
from mpskit.foodpo import split_foodpo_args
from mpskit.knobs import from_args
from mpskit.memory import GB, checkpoint_bytes, dims_from_mapping, trainable_params
from mpskit.planner import Plan
from mpskit.resolve import ResolvedRun


def prepare(run: ResolvedRun) -> tuple[ResolvedRun, Plan | None]:
    """All checks that need no torch (model, datasets, fooDPO settings), then the planned run: the
    planner's choice of the free knobs in its arguments. No plan when the model's dims are unknown;
    refused when nothing fits."""
    check_model(str(run.args["model_name_or_path"]))
    check_datasets(run.args)
    if run.stage == "foodpo":
        split_foodpo_args(run.args)  # fail on bad fooDPO settings before anything loads
    try:
        planned, memory_plan = advice.planned(run)
    except MpskitError as err:
        warn(f"no memory plan: {err.problem}")
        return run, None
    if not memory_plan.fits:
        need = memory_plan.asked.estimate.training / GB
        raise MpskitError(
            f"no setting fits: the run needs about {need:.1f} GB, the budget is "
            f"{memory_plan.budget.training_bytes / GB:.1f} GB ({memory_plan.budget.why})",
            "what would fit: " + "; ".join(memory_plan.would_fit[1:]) + " (see `mpskit plan`)",
        )
    return planned, memory_plan


def check_model(model: str) -> None:
    """A local directory with config.json, or a hub id already in the local cache (or reachable)."""
    path = Path(os.path.expanduser(model))
    fix = (
        "set MODEL_PATH (model_name_or_path) to a local model directory, or run `make demo` for the offline tiny model"
    )
    if path.exists():
        if not (path / "config.json").is_file():
            raise MpskitError(f"model directory {model} has no config.json", fix)
        return
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise MpskitError(f"model {model} not found", fix)
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    if (cache.expanduser() / f"models--{model.replace('/', '--')}").is_dir():
        return
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes") or not _hub_reachable(model):
        raise MpskitError(f"model {model} is not a local directory and the hub cannot be reached", fix)


def _hub_reachable(model: str) -> bool:
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        with urllib.request.urlopen(f"{endpoint}/api/models/{model}", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def check_datasets(args: dict) -> None:
    """Every dataset named in dataset/eval_dataset is in dataset_dir/dataset_info.json."""
    names = [
        name.strip()
        for key in ("dataset", "eval_dataset")
        for name in str(args.get(key) or "").split(",")
        if name.strip()
    ]
    if not names:
        raise MpskitError("no dataset given", "set dataset=NAME (a name from data/dataset_info.json)")
    dataset_dir = Path(str(args.get("dataset_dir", "data")))
    info_file = dataset_dir / "dataset_info.json"
    if not info_file.is_file():
        raise MpskitError(f"{info_file} not found", "set dataset_dir to the folder that holds dataset_info.json")
    try:
        info = json.loads(info_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise MpskitError(f"{info_file} is not valid JSON", "fix the file") from err
    for name in names:
        if name not in info:
            raise MpskitError(
                f"dataset '{name}' is not in {info_file}", f"add it there or use one of {', '.join(sorted(info))}"
            )
        file_name = info[name].get("file_name")
        if file_name and not (dataset_dir / file_name).exists():
            raise MpskitError(
                f"dataset '{name}' points at {dataset_dir / file_name}, which does not exist", "fix file_name"
            )


def check_disk(run: ResolvedRun, root: str | Path = "output") -> None:
    """The run directory can be created, and its disk holds two checkpoints and the final weights."""
    target = Path(str(run.args.get("output_dir") or root)).expanduser().resolve()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise MpskitError(f"cannot create the run directory under {existing}", "set output_dir to a writable folder")
    if not run.model_dims:
        return
    dims, knobs = dims_from_mapping(run.model_dims), from_args(run.args)
    # two checkpoints, the final weights, logs
    need = 2 * checkpoint_bytes(dims, knobs) + trainable_params(dims, knobs) * 4 + 100 * 1024**2
    free = shutil.disk_usage(existing).free
    if free < need:
        raise MpskitError(
            f"{existing} has {free / GB:.1f} GB free; checkpoints need about {need / GB:.1f} GB",
            "free disk space, or set output_dir to a larger disk (and save_total_limit to keep fewer checkpoints)",
        )
