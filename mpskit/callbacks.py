"""TrainerCallbacks for clean stops: Ctrl-C / SIGTERM at a step boundary, a stop at the first
non-finite loss or weight, and the test-only synthetic out-of-memory error."""

from __future__ import annotations

import math
import os
import signal
import sys

import torch
from transformers import TrainerCallback

from mpskit.errors import MpskitError
from mpskit.oom import synthetic_error

FAKE_OOM_VARIABLE = "MPSKIT_FAKE_OOM_AT_STEP"


class StopOnSignal(TrainerCallback):
    """The first SIGINT or SIGTERM saves a checkpoint at the end of the current step and stops; a
    second SIGINT aborts at once (the default handler is back by then)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        print(f"\nmpskit: {self.signal_name}: saving a checkpoint at the end of this step", file=sys.stderr)

    def on_train_begin(self, args, state, control, **kwargs):
        for number in (signal.SIGINT, signal.SIGTERM):
            self._previous[number] = signal.signal(number, self._handle)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.signal_name:
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
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


def fake_out_of_memory() -> list[TrainerCallback]:
    step = os.environ.get(FAKE_OOM_VARIABLE)
    return [FakeOutOfMemory(int(step))] if step else []
