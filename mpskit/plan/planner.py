"""The search: the fastest setting of the free knobs that fits in a memory budget.

Free knobs are those neither the user nor the hardware profile set (or set to `auto`). cutoff_len
and LoRA rank change what is trained, not only how fast, so the planner keeps them as asked when
anything fits there and lowers them (cutoff_len only down to `min_cutoff_len`) only when nothing
does; among settings with the same cutoff_len and rank it takes the highest predicted throughput.
A 4-bit base (quantization_bit, where bitsandbytes builds) comes last of all: only when no 16-bit
setting fits, even with the lowest cutoff_len and rank.
The budget is budget.py's; what would fit when nothing does, and planning a whole run, advice.py's.
No torch import.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from mpskit.datasets.token_lengths import DataLengths
from mpskit.machine.hardware import Hardware, bf16_is_fast, bf16_supported
from mpskit.plan.allocators import PROFILES, Allocator
from mpskit.plan.budget import SAFETY_MARGIN, Budget, budget_for
from mpskit.plan.duration import Throughput, throughput_for, tokens_per_second
from mpskit.plan.memory import GB, PACK_BLOCK, Estimate, ModelDims, estimate, lean_attention_runs
from mpskit.settings.knobs import (
    DEFAULT_CUTOFF_FLOOR,
    DEFAULT_OPTIM,
    EIGHT_BIT_OPTIM,
    Knobs,
    changes,
    effective_batch,
    free_knobs,
    from_args,
    lower_cutoffs,
    lower_ranks,
)
from mpskit.settings.quantization import has_build


@dataclass
class Option:
    knobs: Knobs
    estimate: Estimate
    speed: float  # predicted tokens per second


@dataclass(frozen=True)
class PlanRequest:
    """What the planner is asked, in one value: a stage's arguments on a machine's device for a model, the
    knobs it must keep, and the limits of the search. advice.py builds it from a resolved run; a Plan keeps
    it, so advice asks again with one thing changed (`dataclasses.replace`)."""

    stage: str
    args: dict
    hw: Hardware
    device: str
    dims: ModelDims
    pinned: frozenset[str] = frozenset()
    budget_gb: float | None = None  # None: the budget the hardware gives
    cutoff_floor: int | None = None  # None: DEFAULT_CUTOFF_FLOOR
    world_size: int = 1
    processes_per_node: int = 1
    lengths: DataLengths | None = None  # the training rows' token lengths; None: every row at cutoff_len
    lengths_note: str = ""  # why the lengths are unknown


@dataclass(frozen=True)
class Plan:
    """What the planner decided, whole: the readers (advice, plan_report, checks) never change it;
    advice.plan_run makes the one with its hints from it."""

    request: PlanRequest
    allocator: Allocator  # whose memory the estimates describe (Hardware.allocator's profile)
    budget: Budget
    asked: Option
    chosen: Option | None
    alternatives: tuple[Option, ...] = ()
    changes: tuple[str, ...] = ()
    over_budget: str = ""  # when nothing fits: by how much
    would_fit: tuple[str, ...] = ()  # when nothing fits: what would (advice.py)
    effective_batch: int = 1
    free: frozenset[str] = frozenset()  # the knobs the search could move
    smallest: Option | None = None  # when nothing fits: the setting that needs the least
    throughput: Throughput | None = None  # the figures behind every option's speed

    @property
    def stage(self) -> str:
        return self.request.stage

    @property
    def device(self) -> str:
        return self.request.device

    @property
    def dims(self) -> ModelDims:
        return self.request.dims

    @property
    def lengths(self) -> DataLengths | None:
        return self.request.lengths

    @property
    def lengths_note(self) -> str:
        return self.request.lengths_note

    @property
    def fits(self) -> bool:
        return self.chosen is not None

    def longest_batch(self, knobs: Knobs) -> int | None:
        return longest_batch(self.lengths, knobs)

    def scored_positions(self, knobs: Knobs) -> int | None:
        return scored_positions(self.lengths, knobs, self.stage)


def longest_batch(lengths: DataLengths | None, knobs: Knobs) -> int | None:
    """The longest sequence the data makes under the knobs' cutoff_len (None: cutoff_len itself)."""
    return lengths.longest_batch(knobs.cutoff_len) if lengths else None


def scored_positions(lengths: DataLengths | None, knobs: Knobs, stage: str) -> int | None:
    """The most positions a sequence of the data scores under the knobs' cutoff_len: its answer, and for
    fooDPO its prompt too (None: every position)."""
    return lengths.longest_scored(knobs.cutoff_len, with_prompt=stage == "foodpo") if lengths else None


def data_estimate(dims: ModelDims, knobs: Knobs, stage: str, device: str, lengths: DataLengths | None,
                  allocator: Allocator) -> Estimate:  # fmt: skip
    """The memory estimate at the data's own lengths (at cutoff_len where they are unknown)."""
    return estimate(dims, knobs, stage, device, longest_batch(lengths, knobs), scored_positions(lengths, knobs, stage),
                    allocator)  # fmt: skip


def candidates(
    asked: Knobs, free: set[str], hw: Hardware, device: str, dims: ModelDims, effective: int, floor: int
) -> list[Knobs]:
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
        dtypes.append("bf16")  # M1/M2 emulate bf16: no faster, but half the memory (preference)
    bits = [asked.quantization_bit]
    if "quantization" in free and asked.finetuning == "lora" and has_build(hw):
        bits = [None, 4]  # 4 bits only where no 16-bit setting fits (preference)
    bits_optim_zero = [(q, asked.optim, asked.zero_stage) for q in bits]
    if device == "cuda":
        if "attention" in free and hw.flash_attn:
            attentions.append("fa2")
        optims = [DEFAULT_OPTIM, EIGHT_BIT_OPTIM] if "optim" in free else [asked.optim]
        zero = [2, 3] if "zero" in free and asked.world_size > 1 else [asked.zero_stage]
        bits_optim_zero = list(itertools.product(bits, optims, zero))
    settings = [
        replace(asked, batch=b, checkpointing=c, lora_rank=r, cutoff_len=s, attention=a, dtype=d,
                quantization_bit=q, optim=o, zero_stage=z)
        for s, r, b, c, a, d, (q, o, z) in itertools.product(
            cutoffs, ranks, batches, checkpointing, attentions, dtypes, bits_optim_zero
        )
    ]  # fmt: skip
    if "quantize_embeddings" in free and dims.hidden % PACK_BLOCK == 0:  # preference: only where nothing else fits
        settings += [replace(k, quantize_embeddings=True) for k in settings if k.quantization_bit is not None]
    if "lean_attention" in free:  # auto: lean wherever the attention would be materialised
        settings = [replace(k, lean_attention=lean_attention_runs(k, device, dims)) for k in settings]
    # lean attention replaces sdpa and eager alike: one of the two is enough
    return [k for k in settings if not (k.lean_attention and k.attention == "eager" and "sdpa" in attentions)]


def eval_batch_that_fits(knobs: Knobs, fits) -> Knobs:
    """The setting with the largest held-out batch, from the one asked down by halvings, at which
    `fits`; the smallest where none does. The held-out pass changes no result: only the training knobs
    are searched, and each gets the eval batch it can afford."""
    if knobs.eval_batch is None:
        return knobs
    batch = knobs.eval_batch
    while batch > 1 and not fits(replace(knobs, eval_batch=batch)):
        batch //= 2
    return replace(knobs, eval_batch=batch)


def preference(option: Option) -> tuple:
    """What the planner maximises: what is trained first (unquantized weights, cutoff_len, rank, then
    fp32 over the bf16 that M1/M2 emulate, a candidate only there: bf16 only where fp32 does not fit,
    never to buy speed by turning checkpointing off), then speed, then the plainer optimizer when
    speeds tie. A 4-bit base is the last resort: it changes the model itself, where a shorter
    cutoff_len (down to min_cutoff_len) or rank only changes the adapter; 4-bit embeddings and output
    layer come after that."""
    knobs = option.knobs
    return (
        knobs.quantization_bit is None,
        not knobs.quantize_embeddings,
        knobs.cutoff_len,
        knobs.lora_rank,
        knobs.dtype != "bf16",
        option.speed,
        knobs.optim == DEFAULT_OPTIM,
    )


def plan(request: PlanRequest) -> Plan:
    """The fastest setting of the free knobs that fits, from the estimate alone: no file or package
    look-ups. Memory is planned at the longest batch the data's `lengths` can make, speed at their
    average (both at cutoff_len where they are unknown; `lengths_note` says why). When nothing fits,
    `over_budget` says by how much; advice.py says what would."""
    stage, args, hw, device, dims, lengths = (request.stage, request.args, request.hw, request.device, request.dims,
                                              request.lengths)  # fmt: skip
    asked = from_args(args, request.world_size)
    effective = effective_batch(args)
    half_is_fast = device != "mps" or bf16_is_fast(hw)
    speed = throughput_for(hw.throughput, hw.device, device)
    allocator = PROFILES[hw.allocator(device)]

    def option(knobs: Knobs) -> Option:
        return Option(knobs, data_estimate(dims, knobs, stage, device, lengths, allocator),
                      tokens_per_second(dims, knobs, stage, device, speed, half_is_fast, lengths))  # fmt: skip

    asked_option = option(asked)
    outside = asked_option.estimate.framework + asked_option.estimate.libraries  # RAM the run's figure leaves out
    budget = budget_for(hw, device, outside, request.budget_gb, request.processes_per_node)
    limit = budget.training_bytes * (1 - SAFETY_MARGIN)
    pinned = set(request.pinned) | ({"lora_rank"} if asked.finetuning != "lora" else set())
    free = free_knobs(pinned)
    floor = request.cutoff_floor or DEFAULT_CUTOFF_FLOOR
    settings = candidates(asked, free, hw, device, dims, effective, floor)
    if "eval_batch" in free:
        settings = [eval_batch_that_fits(k, lambda setting: option(setting).estimate.training <= limit)
                    for k in settings]  # fmt: skip
    options = [option(k) for k in settings]
    fitting = [o for o in options if o.estimate.training <= limit]
    fitting.sort(key=preference, reverse=True)
    chosen = fitting[0] if fitting else None
    common = {"effective_batch": effective, "free": frozenset(free), "throughput": speed}
    if fitting:
        share_cut = lengths.share_cut(chosen.knobs.cutoff_len) if lengths else None
        return Plan(request, allocator, budget, asked_option, chosen, alternatives=_alternatives(fitting),
                    changes=tuple(changes(asked, chosen.knobs, effective, floor, share_cut)), **common)  # fmt: skip
    smallest = min(options, key=lambda o: o.estimate.training)
    needs, over = smallest.estimate.training / GB, (smallest.estimate.training - limit) / GB
    over_budget = (
        f"the smallest setting needs {needs:.2f} GB, {over:.2f} GB over the budget's {limit / GB:.2f} GB that "
        f"the planner fills ({1 - SAFETY_MARGIN:.0%}: it keeps {SAFETY_MARGIN:.0%} spare for what no estimate sees)"
    )
    return Plan(request, allocator, budget, asked_option, None, smallest=smallest, over_budget=over_budget,
                **common)  # fmt: skip


def _alternatives(fitting: list[Option], count: int = 3) -> tuple[Option, ...]:
    """The next best settings that differ in a speed knob from the chosen one."""
    best = fitting[0]
    same_quality = [
        o
        for o in fitting[1:]
        if (o.knobs.cutoff_len, o.knobs.lora_rank, o.knobs.quantize_embeddings)
        == (best.knobs.cutoff_len, best.knobs.lora_rank, best.knobs.quantize_embeddings)
    ]
    same_quality.sort(key=lambda o: o.speed, reverse=True)
    return tuple(same_quality[:count])
