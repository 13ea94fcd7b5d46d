"""The training recipe: check inputs, export the environment, write the run directory, run LLaMA-Factory.

Order matters: the MPS variables and device hiding must be in place before torch is imported, and
every check runs before the run directory is created, so a bad input leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from mpskit.collector import libraries_imported
from mpskit.datasets.plain_data import dataset_info_text, moved_to, row_counts
from mpskit.engine import lf
from mpskit.engine.bends import hide_accelerators
from mpskit.engine.environment import enter_run_environment
from mpskit.errors import Interrupted, MpskitError, NextRung, SignalExit
from mpskit.machine.hardware import detect, installed_version
from mpskit.machine.launch import inside_launch, launch, launched, node_suffix
from mpskit.machine.mps_env import env_values
from mpskit.plan import planner
from mpskit.plan.advice import plan_duration
from mpskit.plan.memory import GB
from mpskit.recipes.changes import say_changes
from mpskit.recipes.checks import check_device, check_disk, check_packages, check_trains, check_with_engine, prepare
from mpskit.run.attempts import run_attempts
from mpskit.run.awake import kept_awake
from mpskit.run.quiet import log_lines
from mpskit.run.signals import Held, Stopped
from mpskit.run.summary import summary_lines
from mpskit.rundir.checkpoints import checkpoint_step, checkpoints
from mpskit.rundir.folder import (
    DATASET_INFO,
    RunDir,
    args_text,
    check_rebuildable,
    claim_run_dir,
    latest_run_dir,
    read_yaml,
    real_run_path,
    release,
)
from mpskit.rundir.record import FINISHED, Attempt, Duration, Ladder, Memory, RunRecord, recoverable_fields
from mpskit.rundir.trainer_log import read_log
from mpskit.settings import knobs
from mpskit.settings.resolve import ResolvedRun
from mpskit.settings.run_spec import RunSpec
from mpskit.temporary import exit_if_signalled

VERSIONED = ("torch", "transformers", "peft", "trl", "llamafactory")


def export_environment(run: ResolvedRun) -> dict[str, str]:
    env = env_values(run.hardware)
    os.environ.update(env)
    return env


def write_run_dir(
    run: ResolvedRun, env: dict[str, str], command: list[str], memory_plan=None, ladder: Ladder | None = None
) -> RunDir:
    path = claim_run_dir(run.run_name, run.args.get("output_dir"), suffix=node_suffix(run.processes[1]))
    try:
        return _write_claimed(path, run, env, command, memory_plan, ladder)
    except BaseException:
        release(path)
        raise


def _write_claimed(
    path: Path, run: ResolvedRun, env: dict[str, str], command: list[str], memory_plan, ladder: Ladder | None
) -> RunDir:
    spec = RunSpec.of(run.args)
    args = spec.yaml_args()
    args["output_dir"] = written_output_dir(path)
    files = {}
    if run.datasets:  # plain data files: registered in the run folder itself
        args["dataset_dir"] = args["output_dir"]
        files = {**run.data_files, DATASET_INFO: dataset_info_text(run.datasets)}
    changed = say_changes(run, args)
    record = RunRecord(
        run_name=run.run_name,
        stage=run.stage,
        device=run.device,
        hardware=run.hardware.as_dict(),
        layers=run.layers,
        environment=env,
        mps_hidden=run.hide_mps,
        llamafactory_args=args,
        mpskit_args=spec.record_args(),
        changed_from_given=changed,
        model_dims=run.model_dims,
        data_rows=row_counts(run.datasets),
        memory=memory_record(memory_plan),
        duration=Duration(**d.as_dict()) if memory_plan and (d := plan_duration(run, memory_plan)) else Duration(),
        ladder=ladder,
        processes=list(run.processes),
        keep_awake=run.settings.keep_awake,
        command=command,
        started=time.strftime("%Y-%m-%dT%H:%M:%S"),
        versions={pkg: installed_version(pkg) for pkg in VERSIONED},
    )
    return RunDir.create(path, record, args_text(args), files)


def written_output_dir(path: Path) -> str:
    """output_dir as llamafactory.yaml says it: relative to the folder mpskit runs in when the run lies
    under it (`llamafactory-cli train output/<run>/<time>/llamafactory.yaml` from there), so nothing in
    a run folder names it by an absolute path; mpskit itself trains a run wherever its folder now is."""
    here, where = Path.cwd().resolve(), path.resolve()
    return os.path.relpath(where, here) if where.is_relative_to(here) else str(where)


def memory_record(memory_plan: planner.Plan | None) -> Memory:
    if memory_plan is None:
        return Memory()
    chosen = memory_plan.chosen.knobs
    return Memory(
        predicted=memory_plan.chosen.estimate.as_dict(),
        dims=dataclasses.asdict(memory_plan.dims),
        knobs=dataclasses.asdict(chosen),
        allocator=memory_plan.allocator.name,
        longest_batch=memory_plan.longest_batch(chosen),
        scored_positions=memory_plan.scored_positions(chosen),
        budget_gb=round(memory_plan.budget.training_bytes / GB, 3),
        budget=memory_plan.budget.why,
        planner_changes=list(memory_plan.changes),
    )


def ladder_for(run: ResolvedRun) -> Ladder:
    return Ladder(
        free=sorted(knobs.ladder_knobs(run.pinned, run.settings.oom_ladder)),
        cutoff_floor=run.settings.min_cutoff_len,
    )


def train(run: ResolvedRun, command: list[str] | None = None) -> Path:
    """Run one training job end to end: write its run folder, then continue it the way `--resume`
    and every torchrun rank do; returns the run directory. The environment and device hiding come
    first, before LLaMA-Factory (and torch) is imported for the engine's checks; a misspelt key is
    answered before either, from the argument classes' source (lf.key_names)."""
    check_trains(run.args)
    check_packages(run.args)
    run, memory_plan = prepare(run)
    check_device(run)  # Megatron's keys off CUDA are said as such, not as unknown keys
    lf.check_keys(run.args, lf.key_names())
    check_disk(run, memory_plan)
    env = export_environment(run)
    with libraries_imported():
        if run.hide_mps:
            hide_accelerators()
        lf.import_engine()
    check_with_engine(run.args)
    exit_if_signalled()  # a stop the libraries' imports or checks swallowed: no run folder is made
    ladder = ladder_for(run)
    with Held() as held:  # a stop signal while the folder is written waits for it to be whole
        run_dir = write_run_dir(run, env, command or sys.argv, memory_plan, ladder)
    with _stop_recorded(run_dir, held.signal_name):
        print(f"mpskit: run directory {run_dir.path}", file=sys.stderr)
        for note in memory_plan.changes if memory_plan else []:
            print(f"mpskit: planner: {note}", file=sys.stderr)
        return continue_run(run_dir)


@contextlib.contextmanager
def _stop_recorded(run: RunDir, held: str | None) -> Iterator[None]:
    """A signal from the moment the run folder exists (HELD while it was written) to the moment its
    attempt's own guard records it (the command line's SIGTERM/SIGHUP exit, Ctrl-C): recorded as an
    attempt stopped before training began, so the record says what happened and --resume starts it."""
    attempts = len(run.record.attempts)
    try:
        if held:
            raise Stopped(held, "before training began")
        yield
    except (Stopped, SignalExit, KeyboardInterrupt) as stop:
        now = RunDir.open(run.path)
        if len(now.record.attempts) != attempts:  # the attempt recorded its own end
            raise
        name = getattr(stop, "signal_name", "SIGINT")  # KeyboardInterrupt: Ctrl-C
        now.add_attempt(Attempt(attempts + 1, outcome=f"stopped by {name} before training began"))
        raise Interrupted(run.path, None) from None


def _launch(run: RunDir, processes: tuple[int, int]) -> Path:
    """The run's processes through torchrun. A stop that rank 0 recorded ends as a stop does in one process;
    processes that ended without a record (killed) leave an attempt that says which."""
    run_dir, before, started = run.path, len(run.record.attempts), time.time()
    code = launch(run_dir, *processes, run.record.device)
    run = RunDir.open(run_dir)  # as the ranks left it
    silent = _ranks_without_a_record(run_dir, processes[0], started) if code != 0 else []
    ranks = f"rank{'s' * (len(silent) > 1)} {', '.join(map(str, silent))}"
    said = f"; {ranks} ended without a record (killed?)" if silent else ""
    recorded = len(run.record.attempts) > before
    if not silent and recorded and run.record.attempts[-1].outcome.startswith("stopped by"):
        raise Interrupted(run_dir, run.last_checkpoint())
    if code != 0:
        if not recorded:
            run.add_attempt(Attempt(before + 1, outcome=f"the processes ended with exit code {code}{said}"))
        raise MpskitError(
            f"the training processes stopped with exit code {code}{said} (messages above)",
            f"fix the cause, then continue from the last checkpoint: mpskit train --resume {run_dir}",
        )
    return run_dir


def _ranks_without_a_record(run_dir: Path, per_node: int, since: float) -> list[int]:
    """This node's ranks that wrote no rank-N.json since SINCE."""
    first = int(os.environ.get("NODE_RANK") or 0) * per_node
    files = {number: run_dir / f"rank-{number}.json" for number in range(first, first + per_node)}
    return [number for number, file in files.items() if not file.is_file() or file.stat().st_mtime < since]


def resume(run_dir: str | Path | None = None, rebuild: bool = False, data: dict[str, str] | None = None) -> Path:
    """Continue a stopped, killed or failed run from its newest complete checkpoint (from step 0 when it
    has none), with its own settings. A run that finished is left as it is: resuming it would train
    past its end and rewrite its results. `rebuild`: with a new record in place of a damaged one.
    `data`: dataset=/eval_dataset= paths of plain data files that moved since the run registered them."""
    if rebuild and not run_dir:
        raise MpskitError("--rebuild-record needs the run folder named",
                          "mpskit train --resume output/<run>/<time> --rebuild-record")  # fmt: skip
    path = real_run_path(Path(run_dir)) if run_dir else latest_run_dir()
    return continue_run(rebuild_record(path) if rebuild else RunDir.open(path), data or {})


def rebuild_record(path: Path) -> RunDir:
    """A record for a run folder whose mpskit.json is damaged or gone (rundir.folder.check_rebuildable), from
    what the folder still holds: llamafactory.yaml (the arguments), the fields of the damaged record
    that still read (mpskit's own keys such as the lean paths, the dims, the process layout), this
    machine (the device and its MPS variables), and one attempt when it trained before: finished when
    it trained to its last step (then nothing trains), of unknown outcome otherwise (its checkpoints and
    trainer_log.jsonl stay as they are). Lost with the old record: the memory plan and the ladder's
    free knobs (none move on an out-of-memory error)."""
    args = read_yaml(path)
    check_rebuildable(path, args)
    hardware = detect()
    device = trained_device(args, hardware.device)
    trained = bool(read_log(path)) or bool(checkpoints(path))
    finished = RunDir(path, RunRecord("", "", device)).trained_to_the_end()
    outcome = FINISHED if finished else "unknown (record rebuilt)"
    record = RunRecord(
        run_name=path.resolve().parent.name,
        stage=str(args.get("stage", "")),
        device=device,
        hardware=hardware.as_dict(),
        environment=env_values(hardware),  # as train records it, whatever the device
        mps_hidden=device == "cpu" and hardware.device == "mps",
        llamafactory_args=args,
        command=["mpskit", "train", "--resume", str(path)],
        versions={pkg: installed_version(pkg) for pkg in VERSIONED},
        attempts=[Attempt(1, outcome=outcome)] if trained or finished else [],
    )
    record = dataclasses.replace(record, **recoverable_fields(path))
    print(f"mpskit: rebuilt the run record of {path} from its written arguments; the damaged one is kept",
          file=sys.stderr)  # fmt: skip
    return RunDir.rebuilt(path, record)


def trained_device(args: dict, here: str) -> str:
    """The device a run's written arguments trained on: the CPU where use_cpu is set, or where its processes
    met over gloo (DeepSpeed's CPU ranks keep use_cpu off); else this machine's."""
    return "cpu" if args.get("use_cpu") or args.get("ddp_backend") == "gloo" else here


def continue_run(run: RunDir, data: dict[str, str] | None = None) -> Path:
    """Train a written run directory in this process (from its newest complete checkpoint, or from
    step 0 when it has none), or launch its processes through torchrun when it has several (or runs
    DeepSpeed or FSDP) and this is not one of them. The launching process holds the folder's lock;
    torchrun's ranks work under it."""
    if inside_launch():
        return _continue(run, run.last_checkpoint())
    with run.locked("mpskit train"):  # the record as it is now that no one else writes it
        if run.finished:
            print(f"mpskit: {run.path} already finished (attempt {len(run.record.attempts)}); nothing to resume",
                  file=sys.stderr)  # fmt: skip
            return run.path
        run.check_no_links()
        _find_data(run, data or {})
        checkpoint = run.last_checkpoint()
        run.mend_log((checkpoint_step(checkpoint) or 0) if checkpoint else 0)
        if checkpoint is None and run.record.attempts:
            print(f"mpskit: {run.path} has no complete checkpoint; training it again from step 0", file=sys.stderr)
        with kept_awake(run.record.keep_awake), _summary_at_end(run.path):
            return _continue(run, checkpoint)


def _find_data(run: RunDir, new_paths: dict[str, str]) -> None:
    """The run's plain data files where they are now: each registered one still there, or moved to
    what NEW_PATHS names (then registered there); else one line that says how to point the run at it."""
    entries = run.registered_data()
    moved = moved_to(entries, run.record.data_rows, run.yaml_args(), new_paths, run.path)
    if moved != entries:
        run.register_data(dataset_info_text(moved))
        for name, entry in moved.items():
            if entry != entries[name]:
                print(f"mpskit: '{name}' now reads {entry['file_name']}", file=sys.stderr)


@contextlib.contextmanager
def _summary_at_end(path: Path) -> Iterator[None]:
    """The run's summary on screen and in its train.log when it ends, finished, stopped or failed
    (before the error's own line), once it has trained at all; not when an out-of-memory rung goes on
    in a fresh process, which prints it when the run ends."""
    try:
        yield
    except NextRung:
        raise
    except BaseException:
        _print_summary(path)
        raise
    _print_summary(path)


def _print_summary(path: Path) -> None:
    lines = _summary(path)
    for line in lines:
        print(line, file=sys.stderr)
    log_lines(path, lines)


def _summary(path: Path) -> list[str]:
    """No lines where the run never trained, or its record cannot be read (the error that follows says why)."""
    try:
        run = RunDir.open(path)
    except (MpskitError, OSError):
        return []
    return summary_lines(run) if run.record.attempts else []


def _continue(run: RunDir, checkpoint: Path | None) -> Path:
    processes = tuple(run.record.processes)
    distributed = launched(processes, run.yaml_args())
    if distributed and not inside_launch():
        return _launch(run, processes)
    enter_run_environment(run.record)
    args = run.train_args()
    saved = run.record.ladder or Ladder([], knobs.DEFAULT_CUTOFF_FLOOR)
    # one process out of memory cannot change the knobs of the others: no fallback when distributed
    ladder = Ladder([] if distributed else saved.free, saved.cutoff_floor)
    if checkpoint is None and args.get("resume_from_checkpoint"):  # the user's, from another run
        checkpoint = Path(args["resume_from_checkpoint"])
    if checkpoint:
        print(f"mpskit: resuming {run.path} from {checkpoint}", file=sys.stderr)
    return run_attempts(run, args, ladder, checkpoint)
