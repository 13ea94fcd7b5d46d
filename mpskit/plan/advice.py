"""Planning a whole run: its model's dimensions, the search, and when nothing fits, what would:
unpinning, a shorter cutoff_len, a larger machine, a smaller model preset, a larger hardware profile.
The file look-ups (config.json, presets, profiles) live here, not in the search. No torch import.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from mpskit.datasets.token_lengths import DataLengths, data_lengths
from mpskit.errors import MpskitError
from mpskit.files import read_json
from mpskit.machine.hardware import Hardware, load_hardware, profile_names
from mpskit.machine.hub import hub_cached_file, hub_config, looks_like_hub_id
from mpskit.plan.budget import SAFETY_MARGIN
from mpskit.plan.duration import RunDuration, run_duration
from mpskit.plan.memory import GB, ModelDims, dims_from_mapping, parameters_text
from mpskit.plan.planner import Plan, PlanRequest, data_estimate, plan
from mpskit.presets import load_yaml, preset_names, resolve_preset_file
from mpskit.settings.knobs import as_words, to_args
from mpskit.settings.quantization import has_build
from mpskit.settings.resolve import ResolvedRun, device_args
from mpskit.stages import PLANNED, stage_of

# The keys "what would fit" names, in this order.
ADVICE_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "cutoff_len", "lora_rank",
               "disable_gradient_checkpointing")  # fmt: skip


def model_dims(run_dims: dict, model_path: str, revision: str | None = None) -> ModelDims:
    """Dims from a local model's own config.json (it is the model that trains, whatever preset named
    another), else from the model preset, else from a hub model's config.json (hub.py)."""
    config = Path(str(model_path)).expanduser() / "config.json"
    try:
        if config.is_file():
            data = read_json(config)
        elif run_dims:
            return dims_from_mapping(run_dims)
        elif looks_like_hub_id(model_path):
            data = hub_config(model_path, revision)
        else:
            raise MpskitError(
                f"the memory model needs the dimensions of {model_path}",
                "use a model_preset (configs/models), a local model directory with config.json, or a hub id (org/name)",
            )
        return dims_from_mapping(data.get("text_config", data))
    except (ValueError, json.JSONDecodeError) as err:
        if config.is_file():
            raise MpskitError(f"cannot read the model's dimensions from {config}: {err}",
                              "fix that value in config.json, or give another model") from err  # fmt: skip
        raise MpskitError(f"cannot read the model's dimensions: {err}", "add dims: to the model preset") from err


def what_would_fit(result: Plan) -> list[str]:
    """For a plan where nothing fits: unpinning, a shorter cutoff_len, a machine of what size. Each asks
    the planner again, the plan's request with one thing changed, within the budget it had."""
    asked = replace(result.request, budget_gb=result.budget.training_bytes / GB)
    stage, device, dims, hw, pinned = asked.stage, asked.device, asked.dims, asked.hw, asked.pinned
    smallest, lengths = result.smallest, result.lengths
    limit = result.budget.training_bytes * (1 - SAFETY_MARGIN)
    notes = []
    if pinned:
        unpinned = plan(replace(asked, pinned=pinned & {"quantization_bit"}))  # the bits: a note of their own
        if unpinned.fits:
            before = to_args(unpinned.asked.knobs, unpinned.effective_batch)
            after = to_args(unpinned.chosen.knobs, unpinned.effective_batch)
            moved = sorted(key for key in pinned if before.get(key) != after.get(key))
            words = as_words(unpinned.chosen.knobs, unpinned.effective_batch, ADVICE_KEYS)
            notes.append(f"unpin {', '.join(moved)}: {words}")
    four_bit_possible = smallest.knobs.finetuning == "lora" and smallest.knobs.quantization_bit != 4 and has_build(hw)
    if "quantization" not in result.free and four_bit_possible:
        bits = {"quantization_bit": 4}
        four_bit = plan(replace(asked, args={**asked.args, **bits}, pinned=pinned | set(bits)))
        if four_bit.fits:
            notes.append(f"quantization_bit=4 {as_words(four_bit.chosen.knobs, four_bit.effective_batch, ADVICE_KEYS)}")
    if "cutoff_len" in result.free:
        for cutoff in (128, 64):
            knobs = replace(smallest.knobs, cutoff_len=min(cutoff, smallest.knobs.cutoff_len))
            if data_estimate(dims, knobs, stage, device, lengths, result.allocator).training <= limit:
                words = as_words(knobs, 0, tuple(key for key in ADVICE_KEYS if key != "gradient_accumulation_steps"))
                notes.append(f"min_cutoff_len={knobs.cutoff_len} {words} ({_cut_words(lengths, knobs.cutoff_len)})")
                break
    memory = "GPU memory" if device == "cuda" else "RAM"
    needed = smallest.estimate.total / (1 - SAFETY_MARGIN) / GB + (hw.headroom_gb or 0)
    own = hw.gpu_memory_gb if device == "cuda" else hw.ram_gb
    if own and needed <= own:
        pass  # the machine has it: what is short is a memory_budget_gb given below it
    elif own and round(needed) <= own:  # "about 8 GB" on an 8 GB machine reads as if this one would do
        notes.append(f"a machine with more {memory} than this one's {own:g} GB (about {needed:.1f} GB)")
    else:
        notes.append(f"a machine with about {needed:.0f} GB {memory}")
    return notes


def _cut_words(lengths: DataLengths | None, cutoff: int) -> str:
    """What a shorter cutoff_len does to the training rows, in words."""
    if lengths is None:
        return f"every example cut to {cutoff} tokens: a run only for short ones"
    share = lengths.share_cut(cutoff)
    return f"it cuts {share:.0%} of the rows" + (": a run only for short ones" if share > 0.1 else "")


def tokenizer_dir(model_path: str, revision: str | None = None) -> Path | None:
    """The folder that holds the model's tokenizer.json: a local model's own, or a hub model's cached
    snapshot (nothing is downloaded for it)."""
    local = Path(model_path).expanduser()
    if (local / "tokenizer.json").is_file():
        return local
    if looks_like_hub_id(model_path):
        cached = hub_cached_file(model_path, "tokenizer.json", revision)
        return cached.parent if cached else None
    return None


def plan_run(run: ResolvedRun) -> Plan:
    """The plan for a resolved run (its presets' dims or its local model's config.json) at the token
    lengths of its training rows (token_lengths.py). When nothing fits, it also names the largest
    model preset that fits here and the smallest hardware profile that fits this run."""
    if not stage_of(run.stage).planned:
        raise MpskitError(
            f"the memory plan covers {', '.join(PLANNED)}, not {run.stage}",
            "set per_device_train_batch_size and cutoff_len yourself (plan stage=sft for a bound)",
        )
    model = str(run.args["model_name_or_path"])
    dims = model_dims(run.model_dims, model, run.args.get("model_revision"))
    lengths, why = data_lengths(run.args, run.stage, tokenizer_dir(model, run.args.get("model_revision")))
    result = plan(request_for(run, run.hardware, run.device, dims, lengths, why))
    if result.fits:
        return result
    hints = what_would_fit(result) + _fits_elsewhere(run, dims, lengths)
    return replace(result, would_fit=tuple(hints))


def plan_duration(run: ResolvedRun, result: Plan) -> RunDuration | None:
    """How long the chosen setting trains the run, from the same figures the search ranked it by."""
    if not result.fits:
        return None
    chosen = result.chosen
    return run_duration(run.args, chosen.knobs, chosen.speed, run.stage, result.effective_batch, run.world_size,
                        result.throughput, result.lengths, result.device)  # fmt: skip


def request_for(
    run: ResolvedRun, hw: Hardware, device: str, dims: ModelDims, lengths: DataLengths | None, lengths_note: str = ""
) -> PlanRequest:
    """What the planner is asked for RUN on HW's DEVICE with DIMS: the run's arguments (the device's where it is
    another), the keys it keeps (under `oom_ladder: keep`, 16-bit weights too) and its own limits."""
    args = run.args if device == run.device else {**run.args, **device_args(hw, device)}
    pinned = run.pinned | ({"quantization_bit"} if run.settings.oom_ladder == "keep" else set())
    settings = run.settings
    return PlanRequest(run.stage, args, hw, device, dims, frozenset(pinned), settings.memory_budget_gb,
                       settings.min_cutoff_len, run.world_size, run.processes[0], lengths, lengths_note)  # fmt: skip


def _fits_elsewhere(run: ResolvedRun, dims: ModelDims, lengths: DataLengths | None) -> list[str]:
    notes = []
    smaller = []
    for name in preset_names("models"):
        other = load_yaml(resolve_preset_file("models", name)).get("dims")
        if other:
            other_dims = dims_from_mapping(other)
            if other_dims.params() >= dims.params():
                continue
            if plan(request_for(run, run.hardware, run.device, other_dims, lengths)).fits:
                smaller.append((other_dims.params(), name))
    if smaller:
        params, name = max(smaller)
        size = parameters_text(params)
        notes.append(f"a smaller model on {run.hardware.name}: model_preset={name} ({size} parameters)")
    machines = []
    for name in profile_names():
        hw = load_hardware(name)
        if name != run.hardware.name and hw.device == run.device and plan(request_for(run, hw, hw.device, dims,
                                                                                      lengths)).fits:
            machines.append((hw.gpu_memory_gb if hw.device == "cuda" else hw.ram_gb, name))
    if machines:
        notes.append(f"this run on a larger machine: --hardware {min(machines)[1]}")
    return notes


def planned(run: ResolvedRun) -> tuple[ResolvedRun, Plan]:
    """The plan for a run, and the run with the chosen setting of its free knobs in its arguments
    (the run as it was when nothing fits)."""
    result = plan_run(run)
    if not result.fits:
        return run, result
    chosen = to_args(result.chosen.knobs, result.effective_batch)
    return replace(run, args={**run.args, **{k: v for k, v in chosen.items() if k not in run.pinned}}), result
