"""Training attempt after attempt in one run directory, losing no work.

An out-of-memory error is recognised (MPS, CUDA, CPU), reported with its figures and the estimate,
and the run continues on the next rung of the fallback ladder from its last checkpoint, moving only
knobs the user left free, at most MAX_ATTEMPTS times. SIGINT/SIGTERM save a checkpoint at the next
step boundary and stop with the resume command (signals.py: at once while loading, or a second
time). A full disk stops with one line naming the newest complete checkpoint. Every attempt, however
it ends, is recorded in mpskit.json.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from mpskit import lf
from mpskit.errors import Interrupted, MpskitError
from mpskit.knobs import LADDER, as_words, effective_batch, from_args, next_rung, to_args
from mpskit.launch import inside_launch, rank
from mpskit.oom import OutOfMemory, recognise
from mpskit.rundir import (
    RunRecord,
    checkpoints,
    last_checkpoint,
    read_log,
    read_record,
    set_aside,
    update_record,
    write_atomic,
)
from mpskit.signals import SignalGuard, Stopped

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
        write_atomic(run_dir / f"rank-{rank()}.json", json.dumps(summary, indent=2, default=str) + "\n")
        if rank() != 0:
            return

    def change(record: RunRecord) -> None:
        record.attempts.append({**attempt, "measured": measured})
        if not measured:
            return
        memory = record.memory
        memory["measured"] = measured
        predicted = memory.get("predicted", {}).get("training_gb")
        if predicted and measured["training_gb"] > 0:
            memory["error"] = round((predicted - measured["training_gb"]) / measured["training_gb"], 4)
        _add_measured_time(record.duration, measured["step_seconds"], attempt["outcome"] == "finished")

    memory = update_record(run_dir, change).memory
    if measured:
        plot_memory(run_dir, samples, measured, memory.get("predicted", {}).get("training_gb"), memory.get("budget_gb"))


def _add_measured_time(duration: dict, step_seconds: list[float], finished: bool) -> None:
    """The training steps' time over every attempt so far, and once finished, the prediction's error."""
    duration["measured_s"] = round(duration.get("measured_s", 0) + sum(step_seconds), 2)
    duration["measured_steps"] = duration.get("measured_steps", 0) + len(step_seconds)
    if step_seconds:
        duration["measured_step_s"] = round(statistics.median(step_seconds[1:] or step_seconds), 4)
    predicted = duration.get("predicted_s")
    if finished and predicted and duration["measured_s"] > 0:
        duration["error"] = round((predicted - duration["measured_s"]) / duration["measured_s"], 4)


def _measured(monitor) -> tuple[dict, list]:
    """The monitor's figures and samples; none when the attempt stopped before it started."""
    return (monitor.stop(), monitor.samples) if monitor else ({}, [])


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
        guard, monitor = SignalGuard(), None
        try:
            with guard:
                lf.import_engine()  # torch, transformers, LLaMA-Factory: slow the first time
                from mpskit.callbacks import StopOnDivergence, StopOnSignal, fake_faults
                from mpskit.monitor import MemoryMonitor
                from mpskit.progress import ProgressLine

                monitor = MemoryMonitor(device)  # after the imports: its baseline
                faults = fake_faults() if attempt == first == 1 else []
                predicted = read_record(run_dir).memory.get("predicted", {}).get("training_gb")
                progress = ProgressLine(monitor, predicted)
                callbacks = [monitor, progress, StopOnSignal(guard), StopOnDivergence(), *faults]
                lean_paths = lf.run(attempt_args, callbacks=callbacks)
        except Stopped as stop:
            outcome = f"stopped by {stop.signal_name} {stop.when}"
            _record_attempt(run_dir, {**entry, "outcome": outcome}, *_measured(monitor))
            raise Interrupted(run_dir, last_checkpoint(run_dir)) from None
        except Exception as err:  # noqa: BLE001 - anything but an out-of-memory error is raised again
            oom = recognise(err)
            if oom is None:
                _fail(run_dir, entry, err, _measured(monitor)[0])
        else:
            outcome = f"stopped by {guard.signal_name}" if guard.signal_name else "finished"
            entry.update(outcome=outcome, **lean_paths)
            _record_attempt(run_dir, entry, *_measured(monitor))
            if guard.signal_name:
                raise Interrupted(run_dir, last_checkpoint(run_dir))
            return run_dir

        _free_device_memory(device)  # out of the except block: the failed attempt's frames are gone
        predicted = read_record(run_dir).memory.get("predicted", {})
        print(_oom_block(oom, predicted.get("training_gb"), attempt, _step_reached(run_dir)), file=sys.stderr)
        rung = next_rung(before, effective, ladder.free, ladder.cutoff_floor)
        entry.update(outcome="out of memory", device_figures=vars(oom), next_rung=rung[1] if rung else None)
        _record_attempt(run_dir, entry, *_measured(monitor))
        if rung is None or attempt == first + MAX_ATTEMPTS - 1:
            raise MpskitError(
                f"out of memory and {'no free knob is left' if rung is None else f'{MAX_ATTEMPTS} attempts made'}",
                f"run with less memory: {_command_that_fits(run_dir, args, effective)}",
            )
        args = {**args, **to_args(rung[0], effective)}
        checkpoint = last_checkpoint(run_dir)
        if rung[0].lora_rank != before.lora_rank:
            # a checkpoint holds the adapter's weights: a new rank cannot resume from them, and
            # LLaMA-Factory would pick the newest one up from output_dir by itself
            for old in checkpoints(run_dir):
                set_aside(old, f"rank-{before.lora_rank}")
            checkpoint = None
        where = f"resuming from {checkpoint.name}" if checkpoint else "restarting from step 0"
        print(f"mpskit: next rung: {rung[1]}; {where}", file=sys.stderr)


def _fail(run_dir: Path, entry: dict, err: Exception, measured: dict) -> NoReturn:
    """Record a failed attempt and raise: a full disk as one line with the resume command, anything
    else as it is."""
    full = disk_full(err)
    what = "disk full" if full else err.problem if isinstance(err, MpskitError) else type(err).__name__
    try:
        _record_attempt(run_dir, {**entry, "outcome": f"error: {what}"}, measured, [])
    except OSError:
        if not full:  # a full disk may not even take the record
            raise
    if not full:
        raise err
    newest = last_checkpoint(run_dir)
    raise MpskitError(
        f"the disk under {run_dir} is full ({_step_reached(run_dir)}); the newest complete checkpoint is "
        f"{newest.name if newest else 'none'}",
        f"free some space, then: mpskit train --resume {run_dir}",
    ) from err


def disk_full(err: BaseException) -> bool:
    """ENOSPC as Python raises it, or as torch.save and safetensors report it in their own errors."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    text = str(err)
    return any(sign in text for sign in ("No space left on device", "code: 28", "file write failed"))


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
