"""Training attempt after attempt in one run directory, losing no work.

An out-of-memory error is recognised (MPS, CUDA, CPU), reported with its figures and the estimate,
and the run continues on the next rung of the fallback ladder from its last checkpoint, moving only
knobs the user left free, at most MAX_ATTEMPTS times in a row, each rung in a fresh process (the
command line execs `mpskit train --resume RUN` on NextRung). SIGINT/SIGTERM save a checkpoint at the next
step boundary and stop with the resume command (signals.py: at once while loading, or a second
time). A full disk stops with one line naming the newest complete checkpoint. Every attempt, however
it ends, is recorded in mpskit.json.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex
import sys
from pathlib import Path
from typing import NoReturn

from mpskit.engine import lf
from mpskit.errors import Interrupted, MpskitError, NextRung, RunFailed
from mpskit.files import disk_full, set_aside, write_atomic
from mpskit.machine.launch import inside_launch, rank
from mpskit.plan.duration import steady_step_s
from mpskit.run.boundary import keep_traceback, one_line
from mpskit.run.oom import OutOfMemory, recognise
from mpskit.run.quiet import LOG_FILE
from mpskit.run.signals import SignalGuard, Stopped
from mpskit.rundir.folder import RunDir, point_latest
from mpskit.rundir.record import FINISHED, Attempt, Duration, Ladder, Memory
from mpskit.settings.knobs import LADDER, OWN_KEYS, Knobs, as_words, effective_batch, from_args, next_rung, to_args
from mpskit.settings.run_spec import RunSpec

MAX_ATTEMPTS = 4  # out-of-memory attempts in a row, each in its own process
OUT_OF_MEMORY = "out of memory"


def _plot(run: RunDir) -> None:
    """The run's loss and reward plots (and fooDPO's beta plot), from the trainer's log history."""
    from mpskit.run.plots import plot_training, run_title

    for line in plot_training(run.path, run_title(run.record)):
        print(f"mpskit: {line}", file=sys.stderr)


def _record_attempt(run: RunDir, attempt: Attempt) -> None:
    """Rank 0 writes mpskit.json and memory.png; with several processes each also writes rank-N.json."""
    from mpskit.run.plots import plot_memory, run_title

    if inside_launch():
        summary = {"rank": rank(), "world_size": int(os.environ["WORLD_SIZE"]), **dataclasses.asdict(attempt)}
        write_atomic(run.path / f"rank-{rank()}.json", json.dumps(summary, indent=2, default=str) + "\n")
        if rank() != 0:
            return
    measured, memory = attempt.measured, run.record.memory
    if measured:
        memory.measured = dataclasses.replace(measured, samples_gb=[])  # the samples are kept per attempt
        predicted = memory.predicted_training_gb
        if predicted and measured.training_gb > 0:
            memory.error = round((predicted - measured.training_gb) / measured.training_gb, 4)
        _add_measured_time(run.record.duration, measured.step_seconds, attempt.outcome == FINISHED)
    run.add_attempt(attempt)
    if measured:
        title = run_title(run.record)
        plot_memory(run.path, run.record.attempts, memory.predicted_training_gb, memory.budget_gb, title)


def _add_measured_time(duration: Duration, step_seconds: list[float], finished: bool) -> None:
    """The training steps' time over every attempt so far, and once finished, the prediction's error."""
    duration.measured_s = round(duration.measured_s + sum(step_seconds), 2)
    duration.measured_steps += len(step_seconds)
    if step_seconds:
        duration.measured_step_s = round(steady_step_s(step_seconds), 4)
    if finished and duration.predicted_s and duration.measured_s > 0:
        duration.error = round((duration.predicted_s - duration.measured_s) / duration.measured_s, 4)


def _oom_block(oom: OutOfMemory, predicted_gb: float | None, attempt: int, step: str) -> str:
    estimate = f"{predicted_gb:.2f} GB" if predicted_gb else "none"
    return f"mpskit: out of memory on {oom.device} in attempt {attempt} ({step}): {oom.figures()}; estimate {estimate}"


def run_attempts(run: RunDir, args: dict, ladder: Ladder, checkpoint: Path | None = None) -> Path:
    """One training attempt in this process: finished, stopped by a signal (then raises Interrupted),
    failed, or out of memory. Out of memory, the next rung of the ladder is recorded (the knobs in
    llamafactory.yaml and the record, its memory plan) and NextRung raised: the command line goes on
    in a fresh process (`mpskit train --resume RUN`), which gives the device and the heap back whole
    and measures the rung's memory as the plan predicts it."""
    effective = effective_batch(args)
    device = run.record.device
    number = len(run.record.attempts) + 1
    attempt_args = {**args, "resume_from_checkpoint": str(checkpoint) if checkpoint else None}
    before = from_args(args)
    attempt = Attempt(number, to_args(before, effective), checkpoint.name if checkpoint else None)
    predicted = attempt.predicted_gb = run.record.memory.predicted_training_gb
    guard, monitor = SignalGuard(), None
    with guard:  # to the end of the record: a signal while it is written only notes itself (signals.py)
        try:
            guard.deliver_held()
            lf.import_engine()  # torch, transformers, LLaMA-Factory: slow the first time
            from mpskit.run.callbacks import OnTrainBegin, StopOnDivergence, StopOnSignal
            from mpskit.run.monitor import MemoryMonitor
            from mpskit.run.progress import ProgressLine
            from mpskit.run.quiet import library_output

            monitor = MemoryMonitor(device)  # after the imports: its baseline
            log_dir = run.path if rank() == 0 else None
            with library_output(log_dir, keep_progress_bar=args.get("disable_tqdm") is False) as log_file:
                progress = ProgressLine(monitor, predicted, log_file)
                started = OnTrainBegin(lambda: _point_latest(run))
                callbacks = [monitor, progress, StopOnSignal(guard), StopOnDivergence(), started]
                # what each lean path did, and the engine that ran
                *lean_paths, engine = lf.run(RunSpec.of(attempt_args), callbacks=callbacks)
        except Stopped as stop:
            guard.ending = True
            attempt.outcome = f"stopped by {stop.signal_name} {stop.when}"
            _record_attempt(run, _with_measured(attempt, monitor))
            raise Interrupted(run.path, _stop_checkpoint(run)) from None
        except Exception as err:  # noqa: BLE001 - anything but an out-of-memory error is raised again
            oom = recognise(err)
            if oom is None:
                guard.ending = True
                began = monitor is not None and len(monitor.step_ends) > 1  # a step ended (after train begin)
                _fail(run, _with_measured(attempt, monitor), err, args, began)
        else:
            guard.ending = True
            attempt.outcome = f"stopped by {guard.signal_name}" if guard.signal_name else FINISHED
            attempt.lean_logits, attempt.lean_attention = lean_paths
            attempt.engine = engine
            if rank() == 0:
                _plot(run)
            _record_attempt(run, _with_measured(attempt, monitor))
            if guard.signal_name:
                raise Interrupted(run.path, _stop_checkpoint(run), at_step_end=True)
            rungs = [entry.next_rung for entry in run.record.attempts if entry.next_rung]
            if rungs:
                print(f"mpskit: finished; out of memory changed: {'; '.join(rungs)}", file=sys.stderr)
            return run.path

    print(_oom_block(oom, predicted, number, run.step_reached()), file=sys.stderr)
    rung = next_rung(before, effective, set(ladder.free), ladder.cutoff_floor)
    attempt.outcome, attempt.device_figures = OUT_OF_MEMORY, vars(oom)
    attempt.next_rung = rung[1] if rung else None
    _record_attempt(run, _with_measured(attempt, monitor))
    in_a_row = len(list(itertools.takewhile(lambda a: a.outcome == OUT_OF_MEMORY, reversed(run.record.attempts))))
    if rung is None or in_a_row >= MAX_ATTEMPTS:
        consent = "" if "lora_rank" in ladder.free else " (or add oom_ladder=adapt: mpskit may then lower them)"
        raise MpskitError(
            f"out of memory and {'no free knob is left' if rung is None else f'{MAX_ATTEMPTS} attempts made'}",
            f"run with less memory: {_command_that_fits(run, args, effective)}{consent}",
        )
    trained = to_args(before, effective)
    changes = {key: value for key, value in to_args(rung[0], effective).items() if trained.get(key) != value}
    _plan_rung(run.record.memory, rung[0], run.record.stage, device)
    run.change_args(changes, tuple(OWN_KEYS))
    checkpoint = run.last_checkpoint()
    if rung[0].lora_rank != before.lora_rank:
        # a checkpoint holds the adapter's weights: a new rank cannot resume from them, and
        # LLaMA-Factory would pick the newest one up from output_dir by itself
        for old in run.checkpoints():
            set_aside(old, f"rank-{before.lora_rank}")
        checkpoint = None
    where = f"resuming from {checkpoint.name}" if checkpoint else "restarting from step 0"
    print(f"mpskit: next rung: {rung[1]}; {where}, in a fresh process", file=sys.stderr)
    raise NextRung(run.path)


def _plan_rung(memory: Memory, rung: Knobs, stage: str, device: str) -> None:
    """The memory plan of the rung's setting becomes the run's (its next attempt is measured against
    it): the memory model on the plan's own dims, data and knobs, with what the ladder moved."""
    if not (memory.dims and memory.knobs):  # a run planned before the record kept them
        memory.predicted = {}
        return
    from mpskit.plan.allocators import PROFILES
    from mpskit.plan.memory import ModelDims, estimate

    moved = {name: getattr(rung, name) for name in LADDER}
    knobs = dataclasses.replace(Knobs(**memory.knobs), **moved)
    memory.predicted = estimate(ModelDims(**memory.dims), knobs, stage, device, memory.longest_batch,
                                memory.scored_positions, PROFILES.get(memory.allocator)).as_dict()  # fmt: skip
    memory.knobs = dataclasses.asdict(knobs)


def _stop_checkpoint(run: RunDir) -> Path | None:
    """The checkpoint a stop names; none in a rank of several, whose launcher looks once every rank has
    ended (a look sets incomplete checkpoints aside, and another rank may still be writing one)."""
    return None if inside_launch() else run.last_checkpoint()


def _point_latest(run: RunDir) -> None:
    """`latest` moves once training starts, never to a run that failed before its first step."""
    if rank() == 0:
        point_latest(run.path)


def _with_measured(attempt: Attempt, monitor) -> Attempt:
    """The attempt with the monitor's figures; none when it stopped before the monitor started."""
    attempt.measured = monitor.stop() if monitor else None
    return attempt


def _fail(run: RunDir, attempt: Attempt, err: Exception, args: dict, began: bool) -> NoReturn:
    """Record a failed attempt and end in one line (run/boundary.py; the traceback goes to train.log):
    a full disk with the resume command; an error of the libraries before the first step ended as a
    setting to change (exit 2); one after it as a failed run with its newest checkpoint (exit 1)."""
    full = disk_full(err)
    attempt.outcome = (
        f"error: {'disk full' if full else err.problem if isinstance(err, MpskitError) else type(err).__name__}"
    )
    try:
        _record_attempt(run, attempt)
    except OSError:
        if not full:  # a full disk may not even take the record
            raise
    if isinstance(err, MpskitError) and not full:
        raise err
    resume = f"mpskit train --resume {run.path}"
    if full:
        where = f"the disk under {run.path} is full ({run.step_reached()})"
        raise MpskitError(f"{where}; {_newest_checkpoint(run)}", f"free some space, then: {resume}") from err
    keep_traceback(err, run.path if rank() == 0 else None)
    line, setting = one_line(err, args)
    full_log = f"the whole traceback is in {run.path / LOG_FILE}"
    if not began:
        change = f"change {setting}" if setting else "change the setting it concerns"
        raise MpskitError(f"{line} (before the first step ended)", f"{change}; {full_log}") from None
    raise RunFailed(
        f"the run failed {run.step_reached()}: {line}; {_newest_checkpoint(run)}",
        f"fix the cause, then: {resume} ({full_log})",
    ) from None


def _newest_checkpoint(run: RunDir) -> str:
    """Looked up only where a line names it: the look-up sets incomplete checkpoints aside."""
    newest = run.last_checkpoint()
    return f"the newest complete checkpoint is {newest.name if newest else 'none'}"


def _command_that_fits(run: RunDir, args: dict, effective: int) -> str:
    """The recorded command with the next rung taken as if every knob were free."""
    knobs = from_args(args)
    rung = next_rung(knobs, effective, set(LADDER), cutoff_floor=64)
    command = run.record.command or ["mpskit", "train"]
    if rung is None:
        return "a smaller model or a machine with more memory (see `mpskit plan`)"
    current, after = to_args(knobs, effective), to_args(rung[0], effective)
    moved = tuple(key for key, value in after.items() if current.get(key) != value)
    return shlex.join([*command, *as_words(rung[0], effective, moved).split()])
