"""TrainerCallbacks for clean stops: Ctrl-C / SIGTERM at a step boundary (signals.py), a stop at the
first non-finite loss or weight, the moment training starts, and the test-only faults (out of memory,
a full disk, a kill)."""

from __future__ import annotations

import errno
import math
import os
import signal
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from mpskit.errors import MpskitError
from mpskit.run.oom import synthetic_error
from mpskit.run.signals import SignalGuard

FAKE_OOM_VARIABLE = "MPSKIT_FAKE_OOM_AT_STEP"
FAKE_FULL_DISK_VARIABLE = "MPSKIT_FAKE_FULL_DISK_AT_STEP"
FAKE_KILL_VARIABLE = "MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP"


class StopOnSignal(TrainerCallback):
    """Carries a SignalGuard's state to the trainer: the phase it is in, and a stop with a checkpoint
    at the end of the step in which the first signal came (see signals.py)."""

    def __init__(self, guard: SignalGuard) -> None:
        self.guard = guard

    def on_train_begin(self, args, state, control, **kwargs):
        self.guard.phase = "training"
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.guard.signal_name:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if not self.guard.signal_name:
            self.guard.phase = "after the last step, while saving the results"
        return control


class OnTrainBegin(TrainerCallback):
    """Calls `action` once the model, data and optimizer are ready and the first step is next."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action

    def on_train_begin(self, args, state, control, **kwargs):
        self.action()
        return control


class StopOnDivergence(TrainerCallback):
    """A non-finite logged loss or gradient norm, or a non-finite trainable weight after an optimizer
    step, stops the run there. The weights are checked at the end of every step, before the trainer
    saves, so no checkpoint of a diverged model is ever written: the newest one stays a good one."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        trainable = [p for p in model.parameters() if p.requires_grad] if model is not None else []
        if trainable and not torch.stack([torch.isfinite(p).all() for p in trainable]).all():
            self._stop(args, state.global_step, "a trainable weight is not finite")
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key in ("loss", "grad_norm", "eval_loss"):
            value = (logs or {}).get(key)
            if isinstance(value, float) and not math.isfinite(value):
                self._stop(args, state.global_step, f"{key} is {value}")
        return control

    @staticmethod
    def _stop(args, step: int, what: str) -> None:
        if step <= 1:  # nothing trained yet: the model, the data or the dtype
            fix = "check the model's weights (a NaN in them?) and the dtype (fp16 can overflow)"
        else:
            fix = (
                f"lower learning_rate (now {args.learning_rate:g}) or pref_beta, then resume from the last "
                f"good checkpoint: mpskit train --resume {args.output_dir}"
            )
        raise MpskitError(f"training diverged at step {step}: {what}", fix)


class FakeOutOfMemory(TrainerCallback):
    """Test-only: MPSKIT_FAKE_OOM_AT_STEP=N raises MPS's out-of-memory error during step N, so the
    fallback ladder and its resume can be tested end to end on a CPU."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            raise synthetic_error(self.step)
        return control


class FakeFullDisk(TrainerCallback):
    """Test-only: MPSKIT_FAKE_FULL_DISK_AT_STEP=N cuts the checkpoint save of step N short the way a
    full disk does (a partial file in .saving/, then ENOSPC), so the stop and the resume after it can
    be tested without filling a real disk."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            partial = os.path.join(args.output_dir, ".saving", f"checkpoint-{self.step}")
            os.makedirs(partial, exist_ok=True)
            with open(os.path.join(partial, "adapter_model.safetensors"), "wb") as file:
                file.write(b"\0" * 64)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), partial)
        return control


class FakeKill(TrainerCallback):
    """Test-only: MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP=N kills the process (SIGKILL, nothing runs after
    it) as soon as the checkpoint of step N is saved: at the last step, the moment between the last
    checkpoint and the record of the end."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        return control


def fake_faults(first_attempt: bool) -> list[TrainerCallback]:
    """The test-only faults the environment asks for: out of memory and a full disk in a run's first
    attempt only (the next one is the recovery), a kill in whichever attempt reaches its step."""
    kinds = ((FAKE_OOM_VARIABLE, FakeOutOfMemory), (FAKE_FULL_DISK_VARIABLE, FakeFullDisk)) if first_attempt else ()
    kinds += ((FAKE_KILL_VARIABLE, FakeKill),)
    return [fault(int(os.environ[name])) for name, fault in kinds if os.environ.get(name)]
