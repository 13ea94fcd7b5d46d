"""The memory budget of a machine, and the fastest setting of the free knobs that fits in it.

Free knobs are those neither the user nor the hardware profile set (or set to `auto`). cutoff_len
and LoRA rank change what is trained, not only how fast, so the planner keeps them as asked when
anything fits there and lowers them (cutoff_len only down to `min_cutoff_len`) only when nothing
does; among settings with the same cutoff_len and rank it takes the highest predicted throughput.
No torch import.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.hardware import Hardware, bf16_is_fast, bf16_supported, load_hardware, profile_names
from mpskit.knobs import (
    DEFAULT_CUTOFF_FLOOR,
    DEFAULT_OPTIM,
    EIGHT_BIT_OPTIM,
    Knobs,
    as_words,
    changes,
    effective_batch,
    free_knobs,
    from_args,
    lower_cutoffs,
    lower_ranks,
    to_args,
)
from mpskit.memory import GB, Estimate, ModelDims, dims_from_mapping, estimate, sequences_per_step
from mpskit.mps_env import hard_cap_gb
from mpskit.presets import load_yaml, preset_names, resolve_preset_file
from mpskit.resolve import ResolvedRun, device_args

# The estimate must fit with this share of the budget to spare: bench/memory_accuracy.py's worst
# underestimate is 13.7% (DPO with checkpointing on Qwen2.5-0.5B dims); the median error is 1.9%.
SAFETY_MARGIN = 0.15
# The keys "what would fit" names, in this order.
ADVICE_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "cutoff_len", "lora_rank",
               "disable_gradient_checkpointing")  # fmt: skip
CUDA_RESERVE_GB = 1.0  # CUDA context and allocator fragmentation
# Rough sustained rates (flop/s) and the fixed cost of one micro-step (s): they only rank settings
# against each other on one machine, so their ratio matters more than their values.
DEVICE_SPEED = {"cpu": (5e10, 0.03), "mps": (3e12, 0.05), "cuda": (2e14, 0.02)}


@dataclass
class Budget:
    training_bytes: int  # what the run may add on top of the imported framework
    why: str


@dataclass
class Option:
    knobs: Knobs
    estimate: Estimate
    speed: float  # predicted tokens per second, relative units


@dataclass
class Plan:
    stage: str
    device: str
    dims: ModelDims
    budget: Budget
    asked: Option
    chosen: Option | None
    alternatives: list[Option] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    would_fit: list[str] = field(default_factory=list)  # when nothing fits: what would
    effective_batch: int = 1

    @property
    def fits(self) -> bool:
        return self.chosen is not None


def budget_for(
    hw: Hardware, device: str, framework_bytes: int, override_gb: float | None = None, processes: int = 1
) -> Budget:
    """Per process: on MPS the smaller of the watermark cap and RAM minus headroom; on CUDA its GPU
    less a reserve; on the CPU the available RAM minus headroom, shared by the processes of this
    machine. RAM budgets also leave room for the framework."""
    framework_gb = framework_bytes / GB
    if override_gb is not None:
        return Budget(int(override_gb * GB), f"memory_budget_gb={override_gb:g}")
    if device == "cuda":
        gb = (hw.gpu_memory_gb or 0) - CUDA_RESERVE_GB
        return Budget(int(gb * GB), f"{hw.gpu_memory_gb} GB GPU minus {CUDA_RESERVE_GB} GB reserve")
    headroom = hw.headroom_gb or 0.0
    if device == "mps":
        cap = hard_cap_gb(hw)
        ram_left = hw.ram_gb - headroom - framework_gb
        why = (
            f"min(MPS cap {cap:.2f} GB, {hw.ram_gb} GB RAM - {headroom} GB headroom - {framework_gb:.1f} GB framework)"
        )
        return Budget(int(min(cap, ram_left) * GB), why)
    ram, what = hw.ram_gb, "RAM"
    if hw.source == "detected":
        import psutil

        ram, what = psutil.virtual_memory().available / GB, "available RAM"
    share = f" / {processes} processes" if processes > 1 else ""
    gb = (ram - headroom) / processes - framework_gb
    why = f"({ram:.1f} GB {what} - {headroom} GB headroom){share} - {framework_gb:.1f} GB framework"
    return Budget(int(gb * GB), why)


def model_dims(run_dims: dict, model_path: str) -> ModelDims:
    """Dims from the model preset, else from a local model's config.json."""
    try:
        if run_dims:
            return dims_from_mapping(run_dims)
        config = Path(str(model_path)).expanduser() / "config.json"
        if config.is_file():
            data = json.loads(config.read_text(encoding="utf-8"))
            return dims_from_mapping(data.get("text_config", data))
    except (ValueError, json.JSONDecodeError) as err:
        raise MpskitError(f"cannot read the model's dimensions: {err}", "add dims: to the model preset") from err
    raise MpskitError(
        f"the memory model needs the dimensions of {model_path}",
        "use a model_preset (configs/models) or a local model directory with config.json",
    )


def predicted_speed(dims: ModelDims, knobs: Knobs, stage: str, device: str, half_is_fast: bool = True) -> float:
    """Tokens per second from a flop count: forward 2N per token plus attention, backward about
    twice the forward's activations work (frozen weights need no weight gradient; LoRA's are tiny),
    one more forward with checkpointing, DPO's reference forward; eager attention does its matrix
    work twice over (scores kept, softmax materialised); plus a fixed cost per micro-step."""
    rate, fixed_s = DEVICE_SPEED.get(device, DEVICE_SPEED["cpu"])
    attention_work = {"eager": 2.0, "sdpa": 1.0, "fa2": 0.9}[knobs.attention]
    layer_flops = 2 * dims.layer_params() + 4 * knobs.cutoff_len * dims.hidden * attention_work
    layers = dims.layers * layer_flops
    head = 2 * dims.vocab * dims.hidden
    per_token = 2 * (layers + head) + (layers if knobs.checkpointing else 0)
    if stage in ("dpo", "foodpo"):
        per_token += layers + head  # reference forward under no_grad
    if knobs.dtype != "fp32" and device != "cpu":
        # 16-bit halves the bytes moved where the hardware has it; M1/M2 emulate bf16 (assumed 20% slower)
        per_token *= 0.5 if half_is_fast else 1.25
    # assumed costs: dequantizing 4/8-bit weights in every matmul; ZeRO-3 gathering weights per layer
    per_token /= (0.75 if knobs.quantization_bit else 1.0) * (0.8 if knobs.zero_stage >= 3 else 1.0)
    tokens = sequences_per_step(stage, knobs.batch) * knobs.cutoff_len
    return tokens / (fixed_s + tokens * per_token / rate)


def candidates(asked: Knobs, free: set[str], hw: Hardware, device: str, effective: int, floor: int) -> list[Knobs]:
    """Every setting of the free knobs, quality knobs (cutoff, rank) first in the order tried."""
    batches = [b for b in range(1, effective + 1) if effective % b == 0] if "batch" in free else [asked.batch]
    checkpointing = [False, True] if "checkpointing" in free else [asked.checkpointing]
    ranks = lower_ranks(asked.lora_rank) if "lora_rank" in free else [asked.lora_rank]
    cutoffs = [asked.cutoff_len]
    if "cutoff_len" in free:
        cutoffs = lower_cutoffs(asked.cutoff_len, min(floor, asked.cutoff_len))
    attentions = ["sdpa", "eager"] if "attention" in free else [asked.attention]
    dtypes = [asked.dtype]
    if "dtype" in free and device == "mps" and asked.dtype == "fp32" and bf16_supported(hw):
        dtypes.append("bf16")  # M1/M2 emulate bf16: slower, but half the memory
    cuda = [(asked.quantization_bit, asked.optim, asked.zero_stage)]
    if device == "cuda":
        if "attention" in free and hw.flash_attn:
            attentions.append("fa2")
        bits = [None, 4] if "quantization" in free and asked.finetuning == "lora" else [asked.quantization_bit]
        optims = [DEFAULT_OPTIM, EIGHT_BIT_OPTIM] if "optim" in free else [asked.optim]
        zero = [2, 3] if "zero" in free and asked.world_size > 1 else [asked.zero_stage]
        cuda = list(itertools.product(bits, optims, zero))
    return [
        replace(asked, batch=b, checkpointing=c, lora_rank=r, cutoff_len=s, attention=a, dtype=d,
                quantization_bit=q, optim=o, zero_stage=z)
        for s, r, b, c, a, d, (q, o, z) in itertools.product(
            cutoffs, ranks, batches, checkpointing, attentions, dtypes, cuda
        )
    ]  # fmt: skip


def _option(dims: ModelDims, knobs: Knobs, stage: str, device: str, half_is_fast: bool) -> Option:
    return Option(
        knobs, estimate(dims, knobs, stage, device), predicted_speed(dims, knobs, stage, device, half_is_fast)
    )


def preference(option: Option) -> tuple:
    """What the planner maximises: what is trained first (cutoff_len, rank, unquantized weights), then
    speed, then the plainer optimizer when speeds tie."""
    knobs = option.knobs
    return (
        knobs.cutoff_len,
        knobs.lora_rank,
        knobs.quantization_bit is None,
        option.speed,
        knobs.optim == DEFAULT_OPTIM,
    )


def plan(
    stage: str,
    args: dict,
    hw: Hardware,
    device: str,
    dims: ModelDims,
    pinned: set[str] = frozenset(),
    budget_gb: float | None = None,
    cutoff_floor: int | None = None,
    world_size: int = 1,
    processes_per_node: int = 1,
    explain: bool = True,
) -> Plan:
    asked = from_args(args, world_size)
    effective = effective_batch(args)
    half_is_fast = device != "mps" or bf16_is_fast(hw)
    asked_option = _option(dims, asked, stage, device, half_is_fast)
    budget = budget_for(hw, device, asked_option.estimate.framework, budget_gb, processes_per_node)
    limit = budget.training_bytes * (1 - SAFETY_MARGIN)
    if asked.finetuning != "lora":
        pinned = set(pinned) | {"lora_rank"}
    free = free_knobs(set(pinned))
    floor = cutoff_floor or DEFAULT_CUTOFF_FLOOR
    options = [
        _option(dims, k, stage, device, half_is_fast) for k in candidates(asked, free, hw, device, effective, floor)
    ]
    fitting = [o for o in options if o.estimate.training <= limit]
    fitting.sort(key=preference, reverse=True)
    result = Plan(stage, device, dims, budget, asked_option, fitting[0] if fitting else None, effective_batch=effective)
    if fitting:
        result.alternatives = _alternatives(fitting)
        result.changes = changes(asked, fitting[0].knobs, effective, floor)
    elif explain:
        result.would_fit = _what_would_fit(stage, args, hw, device, dims, pinned, free, budget, options)
    return result


def _alternatives(fitting: list[Option], count: int = 3) -> list[Option]:
    """The next best settings that differ in a speed knob from the chosen one."""
    best = fitting[0]
    same_quality = [
        o
        for o in fitting[1:]
        if (o.knobs.cutoff_len, o.knobs.lora_rank) == (best.knobs.cutoff_len, best.knobs.lora_rank)
    ]
    same_quality.sort(key=lambda o: o.speed, reverse=True)
    return same_quality[:count]


def _what_would_fit(
    stage: str, args: dict, hw: Hardware, device: str, dims: ModelDims, pinned: set[str], free: set[str],
    budget: Budget, options: list[Option],
) -> list[str]:  # fmt: skip
    limit = budget.training_bytes * (1 - SAFETY_MARGIN)
    smallest = min(options, key=lambda o: o.estimate.training)
    over = (smallest.estimate.training - limit) / GB
    notes = [f"the smallest setting needs {smallest.estimate.training / GB:.2f} GB, {over:.2f} GB over the budget"]
    if pinned:
        unpinned = plan(
            stage,
            args,
            hw,
            device,
            dims,
            budget_gb=budget.training_bytes / GB,
            explain=False,
        )
        if unpinned.fits:
            before = to_args(unpinned.asked.knobs, unpinned.effective_batch)
            after = to_args(unpinned.chosen.knobs, unpinned.effective_batch)
            moved = sorted(key for key in pinned if before.get(key) != after.get(key))
            words = as_words(unpinned.chosen.knobs, unpinned.effective_batch, ADVICE_KEYS)
            notes.append(f"unpin {', '.join(moved)}: {words}")
    if "cutoff_len" in free:
        for cutoff in (128, 64):
            knobs = replace(smallest.knobs, cutoff_len=min(cutoff, smallest.knobs.cutoff_len))
            if estimate(dims, knobs, stage, device).training <= limit:
                words = as_words(knobs, 0, tuple(key for key in ADVICE_KEYS if key != "gradient_accumulation_steps"))
                notes.append(f"min_cutoff_len={knobs.cutoff_len} {words}")
                break
    memory = "GPU memory" if device == "cuda" else "RAM"
    needed = smallest.estimate.total / (1 - SAFETY_MARGIN) / GB + (hw.headroom_gb or 0)
    notes.append(f"a machine with about {needed:.0f} GB {memory}")
    return notes


def plan_run(run: ResolvedRun) -> Plan:
    """The plan for a resolved run (its presets' dims or its local model's config.json). When nothing
    fits, it also names the largest model preset that fits here and the smallest hardware profile
    that fits this run."""
    dims = model_dims(run.model_dims, str(run.args["model_name_or_path"]))
    result = _plan_on(run, run.hardware, run.device, dims)
    if not result.fits:
        result.would_fit += _fits_elsewhere(run, dims)
    return result


def _plan_on(run: ResolvedRun, hw: Hardware, device: str, dims: ModelDims) -> Plan:
    args = run.args if device == run.device else {**run.args, **device_args(hw, device)}
    return plan(
        run.stage,
        args,
        hw,
        device,
        dims,
        pinned=run.pinned,
        budget_gb=run.limits.get("memory_budget_gb"),
        cutoff_floor=run.limits.get("min_cutoff_len"),
        world_size=run.world_size,
        processes_per_node=run.processes[0],
    )


def _fits_elsewhere(run: ResolvedRun, dims: ModelDims) -> list[str]:
    notes = []
    smaller = []
    for name in preset_names("models"):
        other = load_yaml(resolve_preset_file("models", name)).get("dims")
        if other:
            other_dims = dims_from_mapping(other)
            if other_dims.params() < dims.params() and _plan_on(run, run.hardware, run.device, other_dims).fits:
                smaller.append((other_dims.params(), name))
    if smaller:
        params, name = max(smaller)
        notes.append(f"a smaller model on {run.hardware.name}: model_preset={name} ({params / 1e9:.2f}B parameters)")
    machines = []
    for name in profile_names():
        hw = load_hardware(name)
        if name != run.hardware.name and hw.device == run.device and _plan_on(run, hw, hw.device, dims).fits:
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
