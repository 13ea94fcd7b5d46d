"""TrainerCallbacks for clean stops: Ctrl-C / SIGTERM at a step boundary, and the test-only synthetic
out-of-memory error."""

from __future__ import annotations

import os
import signal
import sys

from transformers import TrainerCallback

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
