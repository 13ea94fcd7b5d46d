"""The knobs the planner and the out-of-memory ladder may move, in one table. No torch import.

What a knob is lives here: its field in `Knobs`, the LLaMA-Factory keys that set it (and, when the user
or the hardware profile sets any of them, pin it), how it is read from and written to those keys, where
it sits in the give-up order with its floor, and how it is said in words. What acts on a knob (the
planner, the memory model, the engine's bends) reads its value off the typed run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.presets import config_dir


@dataclass(frozen=True)
class OwnKnobs:
    """mpskit's own knobs, each with its one default: the record's mpskit_args keep them, never the
    YAML (llamafactory-cli would refuse them)."""

    lean_logits: bool = field(default=True, metadata={"help": (
        "next-token log-probabilities in chunks wherever the stage and model allow; `false`: the whole logits "
        "(a knob: kept in the run's record, never in the YAML LLaMA-Factory reads)")})  # fmt: skip
    lean_attention: bool | None = field(default=None, metadata={"help": (
        "the planner turns it on wherever attention would be materialised; `true` or `false` pins it (a knob, "
        "recorded like `lean_logits`)")})  # fmt: skip
    quantize_embeddings: bool | None = field(default=None, metadata={"help": (
        "with `quantization_bit`, the input embeddings and the output layer in the run's bits too; the planner "
        "turns it on only where 4 bits of the linear layers alone do not fit; `true` or `false` pins it (a knob, "
        "recorded like `lean_logits`)")})  # fmt: skip


@dataclass(frozen=True)
class Knobs:
    """The settings memory and speed depend on; the planner searches over these."""

    batch: int  # per-device micro-batch (sequences; DPO pairs)
    cutoff_len: int
    lora_rank: int = 8
    checkpointing: bool = True  # LLaMA-Factory's default
    dtype: str = "fp32"
    attention: str = "sdpa"  # sdpa, eager or fa2
    finetuning: str = "lora"
    quantization_bit: int | None = None  # 4 or 8: QLoRA through bitsandbytes (the planner's on CUDA)
    optim: str = "adamw_torch"  # or an 8-bit bitsandbytes AdamW (the planner's on CUDA; not on MPS)
    zero_stage: int = 0  # DeepSpeed ZeRO: 2 shards gradients and optimizer states, 3 also weights
    world_size: int = 1  # processes sharing the run (the estimate is per process)
    # mpskit's own knobs, with OwnKnobs' defaults: next-token log-probabilities in chunks, never the
    # whole logits; attention by blocks of queries, never the heads x s x s matrices (None, auto: on
    # wherever attention would otherwise be materialised, memory.lean_attention_runs); the embeddings
    # and output layer in the quantized base's bits too (auto: off until the planner needs them)
    lean_logits: bool = OwnKnobs.lean_logits
    lean_attention: bool | None = OwnKnobs.lean_attention
    quantize_embeddings: bool = bool(OwnKnobs.quantize_embeddings)
    eval_batch: int | None = None  # per-device held-out batch (sequences; DPO pairs); None: no evaluation


# knob -> the keys that set it; a knob is pinned when the user or the hardware profile sets any of
# them, and free (the planner's and the ladder's to move) otherwise, or when set to `auto`.
KEYS = {
    "batch": ("per_device_train_batch_size", "gradient_accumulation_steps"),
    "checkpointing": ("disable_gradient_checkpointing",),
    "lora_rank": ("lora_rank",),
    "cutoff_len": ("cutoff_len",),
    "dtype": ("bf16", "fp16"),
    "attention": ("flash_attn",),
    "quantization": ("quantization_bit",),
    "optim": ("optim",),
    "zero": ("deepspeed",),
    "lean_logits": ("lean_logits",),  # mpskit's own keys: recorded in mpskit.json, not in the YAML
    "lean_attention": ("lean_attention",),
    "quantize_embeddings": ("quantize_embeddings",),
    "eval_batch": ("per_device_eval_batch_size",),
}
PLANNER_KEYS = tuple(key for keys in KEYS.values() for key in keys)
OWN_KEYS = {item.name: item.default for item in fields(OwnKnobs)}


def own_settings(args: dict) -> OwnKnobs:
    """mpskit's own knobs as ARGS give them, the rest at their defaults."""
    return OwnKnobs(**{key: args[key] for key in OWN_KEYS if key in args})


def split_own(args: dict) -> tuple[dict, dict]:
    """ARGS as two: LLaMA-Factory's (what llamafactory.yaml says), and mpskit's own knobs that ARGS
    give (run_spec.RunSpec reads them into OwnKnobs)."""
    return ({key: value for key, value in args.items() if key not in OWN_KEYS},
            {key: value for key, value in args.items() if key in OWN_KEYS})  # fmt: skip
ATTENTION = {"disabled": "eager", "fa2": "fa2"}  # flash_attn value -> Knobs.attention; anything else: sdpa
DEFAULT_OPTIM = "adamw_torch"
DEFAULT_BATCH = 8  # transformers' per_device_train_batch_size (and eval batch) when a run file leaves it out
EIGHT_BIT_OPTIM = "paged_adamw_8bit"
# The give-up order's floors: what the planner and the ladder lower no further.
MIN_LORA_RANK = 4
DEFAULT_CUTOFF_FLOOR = 256
# The knobs the out-of-memory ladder moves, least costly first (see next_rung).
LADDER = ("checkpointing", "batch", "lora_rank", "cutoff_len")
KEEP_EXPERIMENT = ("checkpointing", "batch")  # same model, same effective batch: moved even when written
CHANGE_EXPERIMENT = ("lora_rank", "cutoff_len")  # a new adapter, truncated examples
OOM_LADDER = ("keep", "adapt")  # `oom_ladder`: never move CHANGE_EXPERIMENT knobs, or move them written or not


def free_knobs(pinned: set[str]) -> set[str]:
    """Knob names the user left open, from the LLaMA-Factory keys they pinned."""
    return {name for name, keys in KEYS.items() if not pinned & set(keys)}


def ladder_knobs(pinned: set[str], oom_ladder: str | None) -> set[str]:
    """The knobs the out-of-memory ladder may move. Those that keep the experiment always; LoRA rank
    and cutoff_len where the user left them free, or with their consent (`oom_ladder: adapt`), or never
    (`oom_ladder: keep`)."""
    changing = {"keep": set(), "adapt": set(CHANGE_EXPERIMENT)}.get(oom_ladder or "", free_knobs(pinned))
    return set(KEEP_EXPERIMENT) | (changing & set(CHANGE_EXPERIMENT))


def effective_batch(args: dict) -> int:
    """Sequences (or pairs) per optimizer step and process: micro-batch x accumulation."""
    return micro_batch(args) * int(args.get("gradient_accumulation_steps", 1))


def micro_batch(args: dict) -> int:
    return int(args.get("per_device_train_batch_size", DEFAULT_BATCH))


def evaluates(args: dict) -> bool:
    """Whether the run evaluates on held-out data: an eval_strategy, or do_eval (at the end)."""
    return str(args.get("eval_strategy") or "no") != "no" or args.get("do_eval") is True


def eval_batch(args: dict) -> int | None:
    """The held-out batch per device, None where the run does not evaluate."""
    return int(args.get("per_device_eval_batch_size", DEFAULT_BATCH)) if evaluates(args) else None


def deepspeed_file(stage: int) -> str:
    return str(config_dir() / "deepspeed" / f"ds_z{stage}.json")


def zero_stage_of(path: str | None) -> int:
    """The ZeRO stage a DeepSpeed JSON file asks for (0 without one)."""
    if not path:
        return 0
    try:
        config = json.loads(Path(str(path)).expanduser().read_text(encoding="utf-8"))
        return int(config.get("zero_optimization", {}).get("stage", 0))
    except (OSError, ValueError, AttributeError) as err:
        raise MpskitError(f"deepspeed config {path} is not readable JSON", "point deepspeed to a ZeRO config") from err


def whole_logits_when_sharded(args: dict, user: dict) -> None:
    """The lean logits path reads the output layer outside the model's forward, and sends its gradient back
    through the decoder's last hidden states, not the model's outputs. ZeRO-3 partitions that layer, and
    FSDP frees its 16-bit copy after the forward and brings it back only from the outputs' backward (the
    lean path then read freed memory: a cuBLAS failure on a GPU, a crash on the CPU). Under either the
    logits are LLaMA-Factory's (and planned so), and a `lean_logits: true` is refused. A deepspeed file
    that cannot be read is said by the checks that need it (the plan, the device's)."""
    try:
        stage = zero_stage_of(args.get("deepspeed"))
    except MpskitError:
        stage = 0
    sharded = "ZeRO-3" if stage >= 3 else "FSDP" if args.get("fsdp") else None
    if sharded is None or args.get("lean_logits") is False:
        return
    if user.get("lean_logits") is True:
        raise MpskitError(f"lean_logits reads the output layer outside the model's forward, which {sharded} shards",
                          f"leave lean_logits out under {sharded}"
                          + (", or use a ZeRO-2 deepspeed config" if sharded == "ZeRO-3" else ""))  # fmt: skip
    args["lean_logits"] = False


def from_args(args: dict, world_size: int = 1) -> Knobs:
    """The knobs a set of LLaMA-Factory arguments (and mpskit's own knobs) asks for."""
    own = own_settings(args)
    return Knobs(
        batch=micro_batch(args),
        cutoff_len=int(args.get("cutoff_len", 2048)),
        lora_rank=int(args.get("lora_rank", 8)),
        checkpointing=not args.get("disable_gradient_checkpointing", False),
        dtype="bf16" if args.get("bf16") else "fp16" if args.get("fp16") else "fp32",
        attention=ATTENTION.get(str(args.get("flash_attn")), "sdpa"),
        finetuning="full" if args.get("finetuning_type") == "full" else "lora",
        quantization_bit=args.get("quantization_bit"),
        optim=str(args.get("optim") or DEFAULT_OPTIM),
        zero_stage=zero_stage_of(args.get("deepspeed")),
        world_size=world_size,
        lean_logits=bool(own.lean_logits),  # on wherever it applies
        lean_attention=None if own.lean_attention is None else bool(own.lean_attention),
        quantize_embeddings=bool(own.quantize_embeddings) and args.get("quantization_bit") is not None,
        eval_batch=eval_batch(args),
    )


def to_args(knobs: Knobs, effective: int) -> dict:
    """The LLaMA-Factory keys for a setting; accumulation keeps the effective batch. Quantization,
    8-bit optimizers and ZeRO appear only when they are in use."""
    extra = {"quantization_bit": knobs.quantization_bit} if knobs.quantization_bit else {}
    if knobs.eval_batch is not None:
        extra["per_device_eval_batch_size"] = knobs.eval_batch
    if knobs.optim != DEFAULT_OPTIM:
        extra["optim"] = knobs.optim
    if knobs.zero_stage:
        extra["deepspeed"] = deepspeed_file(knobs.zero_stage)
    return {
        "per_device_train_batch_size": knobs.batch,
        "gradient_accumulation_steps": max(1, effective // knobs.batch),
        "disable_gradient_checkpointing": not knobs.checkpointing,
        "lora_rank": knobs.lora_rank,
        "cutoff_len": knobs.cutoff_len,
        "bf16": knobs.dtype == "bf16",
        "fp16": knobs.dtype == "fp16",
        "flash_attn": {"eager": "disabled"}.get(knobs.attention, knobs.attention),
        "lean_logits": knobs.lean_logits,
        "lean_attention": knobs.lean_attention,
        "quantize_embeddings": knobs.quantize_embeddings,
        **extra,
    }


def as_words(knobs: Knobs, effective: int, keys: tuple[str, ...]) -> str:
    """`key=value` words for a command line: these keys of the setting, in this order."""
    args = to_args(knobs, effective)
    return " ".join(f"{key}={str(args[key]).lower() if isinstance(args[key], bool) else args[key]}" for key in keys)


# The give-up order: lower LoRA ranks by halving, shorter cutoffs by a quarter in multiples of 64.
def lower_ranks(start: int) -> list[int]:
    """start, then halvings down to MIN_LORA_RANK."""
    values = [start]
    while values[-1] // 2 >= MIN_LORA_RANK:
        values.append(values[-1] // 2)
    return values


def lower_cutoffs(start: int, floor: int) -> list[int]:
    """start, then multiples of 64 stepping down by a quarter, down to the floor."""
    values = [start]
    while True:
        nxt = max(floor, int(values[-1] * 0.75) // 64 * 64)
        if nxt >= values[-1] or nxt < floor:
            return values
        values.append(nxt)


def next_rung(knobs: Knobs, effective: int, free: set[str], cutoff_floor: int) -> tuple[Knobs, str] | None:
    """The out-of-memory ladder: the least costly change of a free knob that lowers memory, and what
    it costs; None at the bottom. Checkpointing on (slower, same result); halve the micro-batch and
    double accumulation (same effective batch); lower the LoRA rank; shorten cutoff_len to its floor."""
    if "checkpointing" in free and not knobs.checkpointing:
        return replace(knobs, checkpointing=True), "gradient checkpointing on (about a third slower, same result)"
    smaller = [b for b in range(knobs.batch // 2, 0, -1) if effective % b == 0]  # keeps the effective batch
    if "batch" in free and smaller:
        batch = smaller[0]
        return replace(knobs, batch=batch), (
            f"micro-batch {knobs.batch} -> {batch}, accumulation {effective // batch} (same effective batch)"
        )
    ranks = lower_ranks(knobs.lora_rank)
    if "lora_rank" in free and len(ranks) > 1:
        rank = ranks[1]
        return replace(knobs, lora_rank=rank), f"LoRA rank {knobs.lora_rank} -> {rank} (a new adapter: restarts)"
    cutoffs = lower_cutoffs(knobs.cutoff_len, cutoff_floor)
    if "cutoff_len" in free and len(cutoffs) > 1:
        return replace(knobs, cutoff_len=cutoffs[1]), (
            f"cutoff_len {knobs.cutoff_len} -> {cutoffs[1]} (longer examples truncated)"
        )
    return None


def describe(knobs: Knobs, effective: int) -> str:
    """One setting in words, as `mpskit plan` shows it."""
    words = [
        f"batch {knobs.batch} x accumulation {max(1, effective // knobs.batch)}",
        f"cutoff_len {knobs.cutoff_len}",
        f"LoRA rank {knobs.lora_rank}",
        f"checkpointing {'on' if knobs.checkpointing else 'off'}",
        "lean attention" if knobs.lean_attention else knobs.attention,
        knobs.dtype,
    ]
    if knobs.eval_batch is not None:
        words.append(f"eval batch {knobs.eval_batch}")
    if knobs.quantization_bit:
        words.append(f"{knobs.quantization_bit}-bit QLoRA")
    if knobs.quantize_embeddings:
        words.append(f"{knobs.quantization_bit}-bit embeddings and output layer")
    if "8bit" in knobs.optim:
        words.append(knobs.optim)
    if knobs.zero_stage:
        words.append(f"ZeRO-{knobs.zero_stage}")
    return ", ".join(words)


def changes(asked: Knobs, chosen: Knobs, effective: int, floor: int, share_cut: float | None = None) -> list[str]:
    """What the planner changed from what was asked, in words; `share_cut`: the share of the training
    rows the chosen cutoff_len truncates, where their lengths are known."""
    truncated = "longer examples are truncated" if share_cut is None else f"it truncates {share_cut:.0%} of the rows"
    said = {
        "batch": f"micro-batch {asked.batch} -> {chosen.batch}, accumulation {effective // chosen.batch} "
        f"(effective {effective})",
        "checkpointing": f"gradient checkpointing {'on' if chosen.checkpointing else 'off'}",
        "attention": f"attention {asked.attention} -> {chosen.attention}",
        "lean_attention": "lean attention on: exact, without the heads x s x s attention matrices"
        if chosen.lean_attention
        else "lean attention off",
        "dtype": f"dtype {asked.dtype} -> {chosen.dtype}",
        "eval_batch": f"evaluation batch {asked.eval_batch} -> {chosen.eval_batch}: the held-out pass at "
        f"{asked.eval_batch} does not fit",
        "zero_stage": f"DeepSpeed ZeRO-{chosen.zero_stage} over {chosen.world_size} processes",
        "quantization_bit": f"{chosen.quantization_bit}-bit QLoRA (bitsandbytes): nothing fits with 16-bit weights",
        "quantize_embeddings": f"the embeddings and the output layer in {chosen.quantization_bit} bits too "
        "(quantize_embeddings): nothing fits with them in 16 bits",
        "optim": f"optimizer {asked.optim} -> {chosen.optim}",
        "lora_rank": f"LoRA rank {asked.lora_rank} -> {chosen.lora_rank}: nothing fits at rank {asked.lora_rank}",
        "cutoff_len": f"cutoff_len {asked.cutoff_len} -> {chosen.cutoff_len}: nothing fits at {asked.cutoff_len} "
        f"(floor {floor}; set min_cutoff_len to change it); {truncated}",
    }
    auto_off = asked.lean_attention is None and not chosen.lean_attention  # auto where attention is fused
    return [
        text
        for field, text in said.items()
        if getattr(chosen, field) != getattr(asked, field) and not (field == "lean_attention" and auto_off)
    ]
