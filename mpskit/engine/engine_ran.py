"""The engine a training actually ran, read off the trainer as training begins.

accelerate's distributed type, DeepSpeed (with the ZeRO stage its engine runs) or FSDP, the wrapped
model's class, and the process group's backend and size. Under ZeRO, the share of the optimizer's
float32 states this process holds; under ZeRO-3, its share of the partitioned weights too.
Each attempt records it (each rank's rank-N.json too), and `mpskit train`'s summary says it. A
configured engine that did not run fails the run before its first step: accelerate can drop
DeepSpeed or FSDP and train plain DDP instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from mpskit.errors import MpskitError

_WATCHED: list[dict] = []  # the report of the training this process runs now (training_bends)


@contextlib.contextmanager
def watched() -> Iterator[dict]:
    """Within: the training that begins fills the report given (note_trainer)."""
    report: dict = {}
    _WATCHED.append(report)
    try:
        yield report
    finally:
        _WATCHED.remove(report)


def note_trainer(trainer) -> None:
    """As training begins (resumable.Resumable): the engine the trainer runs, checked against its arguments."""
    if not _WATCHED:
        return
    report = engine_of(trainer)
    _WATCHED[-1].update(report)
    check_configured(trainer.args, report)


def engine_of(trainer) -> dict:
    import torch.distributed as dist

    grouped = dist.is_available() and dist.is_initialized()
    wrapped = trainer.model_wrapped
    return {
        "distributed_type": trainer.accelerator.state.distributed_type.value,
        "deepspeed": bool(trainer.is_deepspeed_enabled),
        "zero_stage": wrapped.zero_optimization_stage() if trainer.is_deepspeed_enabled else None,
        "fsdp": bool(trainer.is_fsdp_enabled),
        "wrapped_model": type(wrapped).__name__,
        "backend": dist.get_backend() if grouped else None,
        "world_size": dist.get_world_size() if grouped else 1,
        **(zero_shares(wrapped, trainer.model) if trainer.is_deepspeed_enabled else {}),
    }


def zero_shares(engine, model) -> dict:
    """This process's share of what ZeRO splits: the optimizer's float32 copy of the trainable weights
    (its partitions against their count), and under ZeRO-3 the weights (each one's `ds_tensor` against
    its `ds_numel`), in all and the least and most of any one. About 1/world size each where the split
    is even."""
    trainable = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    optimizer = engine.optimizer
    groups = getattr(optimizer, "single_partition_of_fp32_groups", None)  # ZeRO-1 and 2
    if groups is None:
        groups = getattr(optimizer, "fp32_partitioned_groups_flat", [])  # ZeRO-3
    shares = {"states_share": round(sum(group.numel() for group in groups) / trainable, 4) if trainable else None}
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_tensor")]
    if partitioned:
        held = sum(p.ds_tensor.numel() for p in partitioned)
        shares["weights_share"] = round(held / sum(p.ds_numel for p in partitioned), 4)
        each = [p.ds_tensor.numel() / p.ds_numel for p in partitioned]
        shares["weights_share_range"] = [round(min(each), 4), round(max(each), 4)]  # the least and most of one
    return shares


def configured_zero_stage(deepspeed) -> int | None:
    """The stage a `deepspeed` argument asks for: a file's path, or the mapping transformers read from it."""
    if not deepspeed:
        return None
    from mpskit.settings.knobs import zero_stage_of

    if isinstance(deepspeed, dict):
        return int(deepspeed.get("zero_optimization", {}).get("stage", 0))
    return zero_stage_of(str(deepspeed))


def check_configured(args, report: dict) -> None:
    """The engine the arguments configure is the one that runs: DeepSpeed at its stage, FSDP, every process."""
    problems = []
    stage = configured_zero_stage(args.deepspeed)
    if stage is not None and report["zero_stage"] != stage:
        problems.append(f"deepspeed asks for ZeRO-{stage}, but training began as {describe(report)}")
    if args.fsdp and not report["fsdp"]:
        problems.append(f"fsdp is set, but training began as {describe(report)}")
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if report["world_size"] != launched:
        problems.append(f"{launched} processes were launched, but training began as {describe(report)}")
    if problems:
        raise MpskitError(problems[0], "see the engine's messages in train.log; mpskit trains on no other engine")


def describe(report: dict) -> str:
    """The engine in words: "DeepSpeed ZeRO-3 over 2 processes, gloo", "DDP over 2 processes, gloo",
    "DeepSpeed ZeRO-3 over 1 process, nccl", "one process"."""
    if report.get("deepspeed"):
        engine = f"DeepSpeed ZeRO-{report['zero_stage']}"
    elif report.get("fsdp"):
        engine = "FSDP"
    elif report.get("world_size", 1) > 1:
        engine = "DDP"
    else:
        return "one process"
    size = report["world_size"]
    return f"{engine} over {size} process{'es' if size > 1 else ''}, {report['backend']}"
