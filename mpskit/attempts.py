"""Training attempt after attempt in one run directory, losing no work.

An out-of-memory error is recognised (MPS, CUDA, CPU), reported with its figures and the estimate,
and the run continues on the next rung of the fallback ladder from its last checkpoint, moving only
knobs the user left free, at most MAX_ATTEMPTS times. SIGINT/SIGTERM save a checkpoint at the next
step boundary and stop with the resume command. Every attempt is recorded in mpskit.json.
"""

from __future__ import annotations

import gc
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mpskit import lf
from mpskit.errors import Interrupted, MpskitError
from mpskit.knobs import LADDER, as_words, effective_batch, from_args, next_rung, to_args
from mpskit.launch import inside_launch, rank
from mpskit.oom import OutOfMemory, recognise
from mpskit.rundir import RunRecord, last_checkpoint, read_log, read_record, update_record

MAX_ATTEMPTS = 4


@dataclass
class Ladder:
    """What the fallback may move: the planner's free knobs and the cutoff floor."""

    free: set[str] = field(default_factory=set)
    cutoff_floor: int = 256


def _record_attempt(run_dir: Path, attempt: dict, measured: dict, samples: list) -> None:
    """Rank 0 writes mpskit.json and memory.png; with several processes each also writes rank-N.json."""
    from mpskit.plots import plot_memory

    if inside_launch():
        summary = {"rank": rank(), "world_size": int(os.environ["WORLD_SIZE"]), **attempt, "measured": measured}
        (run_dir / f"rank-{rank()}.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        if rank() != 0:
            return

    def change(record: RunRecord) -> None:
        record.attempts.append({**attempt, "measured": measured})
        memory = record.memory
        memory["measured"] = measured
        predicted = memory.get("predicted", {}).get("training_gb")
        if predicted and measured["training_gb"] > 0:
            memory["error"] = round((predicted - measured["training_gb"]) / measured["training_gb"], 4)

    memory = update_record(run_dir, change).memory
    plot_memory(run_dir, samples, measured, memory.get("predicted", {}).get("training_gb"), memory.get("budget_gb"))


def _free_device_memory(device: str) -> None:
    gc.collect()
    if device in ("cuda", "mps"):
        import torch

        (torch.cuda if device == "cuda" else torch.mps).empty_cache()


def _oom_block(oom: OutOfMemory, predicted_gb: float | None, attempt: int, step: str) -> str:
    estimate = f"{predicted_gb:.2f} GB" if predicted_gb else "none"
    return f"mpskit: out of memory on {oom.device} in attempt {attempt} ({step}): {oom.figures()}; estimate {estimate}"


def run_attempts(run_dir: Path, args: dict, device: str, ladder: Ladder, checkpoint: Path | None = None) -> Path:
    """Train until finished, out of rungs, or stopped by a signal (then raises Interrupted)."""
    from mpskit.callbacks import StopOnDivergence, StopOnSignal, fake_out_of_memory
    from mpskit.monitor import MemoryMonitor

    lf.import_engine()
    effective = effective_batch(args)
    first = len(read_record(run_dir).attempts) + 1
    attempt = first - 1
    while True:
        attempt += 1
        attempt_args = {**args, "resume_from_checkpoint": str(checkpoint) if checkpoint else None}
        before = from_args(args)
        entry = {
            "attempt": attempt,
            "knobs": to_args(before, effective),
            "resumed_from": checkpoint.name if checkpoint else None,
        }
        monitor, stopper = MemoryMonitor(device), StopOnSignal()  # monitor after the imports: baseline
        callbacks = [monitor, stopper, StopOnDivergence(), *(fake_out_of_memory() if attempt == first == 1 else [])]
        try:
            logits_path = lf.run(attempt_args, callbacks=callbacks)
        except Exception as err:  # noqa: BLE001 - anything but an out-of-memory error is raised again
            oom = recognise(err)
            if oom is None:
                what = err.problem if isinstance(err, MpskitError) else type(err).__name__
                _record_attempt(run_dir, {**entry, "outcome": f"error: {what}"}, monitor.stop(), [])
                raise
            del err
            _free_device_memory(device)
        else:
            outcome = f"stopped by {stopper.signal_name}" if stopper.signal_name else "finished"
            entry.update(outcome=outcome, lean_logits=logits_path)
            _record_attempt(run_dir, entry, monitor.stop(), monitor.samples)
            if stopper.signal_name:
                raise Interrupted(run_dir, last_checkpoint(run_dir))
            return run_dir

        predicted = read_record(run_dir).memory.get("predicted", {})
        print(_oom_block(oom, predicted.get("training_gb"), attempt, _step_reached(run_dir)), file=sys.stderr)
        rung = next_rung(before, effective, ladder.free, ladder.cutoff_floor)
        entry.update(outcome="out of memory", device_figures=vars(oom), next_rung=rung[1] if rung else None)
        _record_attempt(run_dir, entry, monitor.stop(), monitor.samples)
        if rung is None or attempt == first + MAX_ATTEMPTS - 1:
            raise MpskitError(
                f"out of memory and {'no free knob is left' if rung is None else f'{MAX_ATTEMPTS} attempts made'}",
                f"run with less memory: {_command_that_fits(run_dir, args, effective)}",
            )
        args = {**args, **to_args(rung[0], effective)}
        # a checkpoint holds the adapter's weights: a new rank cannot resume from it
        checkpoint = last_checkpoint(run_dir) if rung[0].lora_rank == before.lora_rank else None
        where = f"resuming from {checkpoint.name}" if checkpoint else "restarting from step 0"
        print(f"mpskit: next rung: {rung[1]}; {where}", file=sys.stderr)


def _step_reached(run_dir: Path) -> str:
    log = read_log(run_dir)
    return f"after step {log[-1].get('current_steps')}" if log else "before the first logged step"


def _command_that_fits(run_dir: Path, args: dict, effective: int) -> str:
    """The recorded command with the next rung taken as if every knob were free."""
    knobs = from_args(args)
    rung = next_rung(knobs, effective, set(LADDER), cutoff_floor=64)
    command = read_record(run_dir).command or ["mpskit", "train"]
    if rung is None:
        return "a smaller model or a machine with more memory (see `mpskit plan`)"
    current, after = to_args(knobs, effective), to_args(rung[0], effective)
    moved = tuple(key for key, value in after.items() if current.get(key) != value)
    return shlex.join([*command, *as_words(rung[0], effective, moved).split()])
