"""The lines a run ends on, however it ended: where its adapter is, how training went, its memory
against the plan, and the commands to run next. Read from the run folder alone (mpskit.json,
trainer_log.jsonl, all_results.json), so a resumed or relaunched run ends the same way."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psutil

from mpskit.engine.engine_ran import describe
from mpskit.rundir.checkpoints import WEIGHT_FILES
from mpskit.rundir.folder import RunDir
from mpskit.stages import stage_of

ADAPTER = "adapter_model.safetensors"


def summary_lines(run: RunDir) -> list[str]:
    """For a run that has made at least one attempt."""
    record, log = run.record, run.log()
    where = _shown(run.path)
    steps = [row for row in log if "loss" in row]
    newest = None if run.finished else run.last_checkpoint()
    total = (log[-1].get("total_steps") if log else None) or record.duration.steps
    reached = max(log[-1].get("current_steps", 0) if log else 0, _step_of(newest))
    head = f"{record.stage} run {'finished' if run.finished else record.attempts[-1].outcome}"
    wall_s = time.time() - psutil.Process().create_time()  # this command's, imports and loading included
    lines = [f"{head} in {_duration(wall_s)}: step {reached}/{total or '?'}"]
    if steps:
        best = min(steps, key=lambda row: row["loss"])
        lines[0] += (
            f", loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}"
            f" (lowest {best['loss']:.4f} at step {best['current_steps']})"
        )
    engine = record.attempts[-1].engine
    if engine and describe(engine) != "one process":
        lines.append(f"trained with {describe(engine)}")
    head = "held-out at the end | "
    held_out = eval_text(run.results(), shutil.get_terminal_size().columns - len(f"mpskit: {head}"))
    if held_out:
        lines.append(head + held_out)
    measured, predicted = record.memory.measured, record.memory.predicted_training_gb
    if measured:
        memory = f"peak train memory {measured.training_gb:.2f} GB"
        lines.append(memory + (f" (plan {predicted:.2f} GB)" if predicted else ""))
    if not run.finished:  # the error or stop line that follows says how to go on
        lines.append(f"newest complete checkpoint: {f'{where}/{newest.name}' if newest else 'none'}")
        return [f"mpskit: {line}" for line in lines]
    saved = next((name for name in WEIGHT_FILES if (run.path / name).is_file()), None)
    lines.append(f"saved: {where}/{saved}" if saved else f"saved in {where}")
    if saved == ADAPTER:
        lines.append(f"next: mpskit chat {where}")
        lines.append(f"      mpskit eval {where}{'' if _judges_itself(record) else ' --dataset PAIRS'}")
        lines.append(f"      mpskit export {where} -o merged-model/")
    return [f"mpskit: {line}" for line in lines]


def _step_of(checkpoint: Path | None) -> int:
    """A stop while the step accumulated may come after the last logged step but not its checkpoint."""
    return int(checkpoint.name.rsplit("-", 1)[1]) if checkpoint else 0


def _judges_itself(record) -> bool:
    """`mpskit eval RUN` needs no --dataset: a preference run with held-out pairs (evaluate.py)."""
    stage = stage_of(record.stage)
    return bool(stage.pairs and stage.reference_model and record.llamafactory_args.get("eval_dataset"))


def _shown(path: Path) -> str:
    """The run folder as the user would type it from here."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.1f} s"


# An evaluation's figures on screen, in the order they are dropped last to first to fit the line.
HELD_OUT_SHOWN = {"eval_loss": "loss", "eval_accuracy": "token accuracy", "eval_rewards/accuracies": "accuracy",
                  "eval_rewards/margins": "margin", "eval_dynamic_beta": "beta"}  # fmt: skip


def eval_text(metrics: dict, room: int | None = None) -> str:
    """An evaluation's main figures, `loss 0.3362 | accuracy 1.0000 | margin 0.9311`, in ROOM
    columns where given (never without the loss); trainer_log.jsonl and all_results.json keep all."""
    shown = [f"{label} {metrics[key]:.4f}" for key, label in HELD_OUT_SHOWN.items() if key in metrics]
    while room and len(shown) > 1 and len(" | ".join(shown)) > room:
        shown.pop()
    return " | ".join(shown)
