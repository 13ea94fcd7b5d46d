"""What makes a run resume exactly, as a mixin for mpskit's trainers (lean_trainers.py: sft, dpo,
foodpo) and for LLaMA-Factory's own trainers of the other stages (`resumable`: pt, rm, kto).

- A checkpoint appears only when it is complete: transformers writes `checkpoint-N` in place, file by
  file, so a kill or a full disk mid-save leaves a folder that looks like a checkpoint and is not.
  Here it is written under `.saving/` and renamed into the run folder when every file is there (a
  rename within one filesystem is atomic), so `checkpoint-*` only ever names finished saves.
- A run resumed from the checkpoint of its last step trains no further: transformers would take one
  more step when the last step is not at the end of an epoch (step 7 of 6). Only the end of the run
  is done again (the final save, the metrics, the evaluation).
- `train_loss` after a resume is the mean over the whole run: transformers sums only the losses of
  the steps this process ran and divides by every step, so a resumed run reported a loss too low.
- So are its train_runtime and throughput: transformers times only the steps this process ran and
  divides the whole run's samples by that (a run resumed from its last checkpoint: 0.001 s, 40,000
  samples/s).
- A step is evaluated once: LLaMA-Factory's workflow evaluates again after training, at a step the
  epoch's end evaluated already.
Each checkpoint keeps the sum of the losses up to its step and the training time so far
(PROGRESS_FILE), which a resume puts back.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import weakref
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_pt_utils import nested_gather
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from mpskit.engine.engine_ran import note_trainer
from mpskit.files import set_aside

STAGING = ".saving"
# In a checkpoint: {"step": N, "loss_sum": the losses of steps 1..N, "train_s": the seconds training took}
PROGRESS_FILE = "mpskit_progress.json"


def logged_loss_sum(log_history: list[dict], up_to_step: int) -> float:
    """The sum of the per-step training losses up to a step, from the logged interval means.
    Steps after the last log before that step (saved, never logged) count at the mean logged loss."""
    total, last_step = 0.0, 0
    for row in log_history:
        if "loss" in row and row.get("step", 0) <= up_to_step:
            total += row["loss"] * (row["step"] - last_step)
            last_step = row["step"]
    return total + (total / last_step) * (up_to_step - last_step) if last_step else 0.0


def saved_progress(checkpoint: str | None, step: int) -> tuple[float, float] | None:
    """(loss sum, training seconds) that a checkpoint of STEP kept (PROGRESS_FILE); None for one saved
    without it (an older mpskit's)."""
    try:
        saved = json.loads((Path(str(checkpoint)) / PROGRESS_FILE).read_text(encoding="utf-8"))
        return (float(saved["loss_sum"]), float(saved["train_s"])) if saved["step"] == step else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _SeedLossSum(TrainerCallback):
    """Runs right after transformers zeroes its loss sum and starts its clock; on a resume, puts the
    earlier steps back: the checkpoint's own loss sum and training time, or (a checkpoint of an older
    mpskit) the sum the logged means give. Then notes the engine that runs (engine_ran.py)."""

    def __init__(self, trainer) -> None:
        self.trainer = weakref.ref(trainer)  # no cycle: a failed trainer is freed as soon as it is dropped

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer()
        trainer.mpskit_started, trainer.mpskit_earlier_s = time.time(), 0.0
        if state.global_step > 0:
            saved = saved_progress(args.resume_from_checkpoint, state.global_step)
            if saved is None:
                trainer._total_loss_scalar = logged_loss_sum(state.log_history, state.global_step)
            else:
                trainer._total_loss_scalar, trainer.mpskit_earlier_s = saved
        note_trainer(trainer)  # the engine that runs, as configured (engine_ran.py)
        return control


class Resumable:
    """Mix in before a transformers Trainer subclass."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # first of the callbacks, so that its clock starts with transformers' own (the monitor's and the
        # others' on_train_begin take tens of ms, which the logged train_runtime counts)
        self.callback_handler.callbacks.insert(0, _SeedLossSum(self))

    def _run_epoch(self, *args, **kwargs):
        if self.state.global_step >= self.state.max_steps > 0:  # resumed from the last step's checkpoint
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **kwargs):
        """A step's held-out figures are computed once: the workflow's evaluation after training, at a
        step the epoch's end evaluated already, takes that evaluation's figures (the same weights, the
        same data: identical figures, about a tenth of a short stage's time)."""
        key = (self.state.global_step, metric_key_prefix)
        evaluated = getattr(self, "_mpskit_evaluated", {})
        if eval_dataset is None and key in evaluated:
            return dict(evaluated[key])
        metrics = super().evaluate(
            eval_dataset=eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix, **kwargs
        )
        if eval_dataset is None:
            self._mpskit_evaluated = {key: dict(metrics)}
        return metrics

    def _finalize_training(self, trial, num_train_samples, start_time):
        """train_runtime and the speeds over every attempt's training time, not this process's alone."""
        return super()._finalize_training(trial, num_train_samples, start_time - self.mpskit_earlier_s)

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = Path(self._get_output_dir(trial=trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self._get_output_dir = lambda trial=None: str(run_dir / STAGING)  # this call only
        try:
            super()._save_checkpoint(model, trial)
        finally:
            del self._get_output_dir
        self.accelerator.wait_for_everyone()  # every process has written its part (RNG states)
        # the losses up to this step: the logged ones' sum and those since, averaged over the processes
        loss_sum = self._total_loss_scalar + nested_gather(self._tr_loss, self.args.parallel_mode).mean().item()
        if self.args.should_save:
            train_s = self.mpskit_earlier_s + time.time() - self.mpskit_started
            progress = {"step": self.state.global_step, "loss_sum": loss_sum, "train_s": train_s}
            (run_dir / STAGING / name / PROGRESS_FILE).write_text(json.dumps(progress), encoding="utf-8")
            best = self.state.best_model_checkpoint
            if best and Path(best).parent.name == STAGING:  # the state names the checkpoint's final place
                self.state.best_model_checkpoint = str(run_dir / Path(best).name)
                self.state.save_to_json(str(run_dir / STAGING / name / TRAINER_STATE_NAME))
            if (run_dir / name).exists():
                set_aside(run_dir / name, "replaced")
            os.replace(run_dir / STAGING / name, run_dir / name)
            with contextlib.suppress(OSError):  # empty now, unless an earlier save was cut off
                (run_dir / STAGING).rmdir()
            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()


def resumable(trainer: type) -> type:
    """One of LLaMA-Factory's own trainers (pt, rm, kto) with Resumable mixed in (bends.RESUMABLE)."""
    return type(f"Resumable{trainer.__name__}", (Resumable, trainer), {})
