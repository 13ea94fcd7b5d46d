"""TrainerCallbacks for clean stops: Ctrl-C / SIGTERM at a step boundary (signals.py), a stop at the
first non-finite loss or weight, and the moment training starts. (The tests' faults, an out of memory,
a full disk or a kill at a chosen step, are the tests' own: tests/plugins/faults.py.)"""

from __future__ import annotations

import math
import signal
import sys
from collections.abc import Callable

import torch
from transformers import TrainerCallback

from mpskit.errors import MpskitError
from mpskit.run.signals import SignalGuard, Stopped


class StopOnSignal(TrainerCallback):
    """Carries a SignalGuard's state to the trainer: the phase it is in, and a stop with a checkpoint
    at the end of the step in which the first signal came (see signals.py)."""

    def __init__(self, guard: SignalGuard) -> None:
        self.guard = guard

    def on_train_begin(self, args, state, control, **kwargs):
        """A stop that came before and did not end the attempt ends it here: a library caught its raise
        (`datasets` hashes a transform inside a bare `except:`, and a signal there was lost)."""
        if self.guard.signal_name:
            raise Stopped(self.guard.signal_name, "before training began")
        self.guard.phase = "training"
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._agree(args.device)
        if self.guard.signal_name:  # a stop saves and goes: no held-out pass (minutes on a 7B model)
            control.should_save = True
            control.should_training_stop = True
            control.should_evaluate = False
        return control

    def _agree(self, device: torch.device) -> None:
        """Among several processes, a signal to one stops them all at the end of the same step: a stop that
        one rank alone took would leave the others waiting in their next step's collective for ever, and
        its checkpoint (a collective too under ZeRO) unwritten. One small all-reduce a step: the highest
        signal number any rank has."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        number = signal.Signals[self.guard.signal_name].value if self.guard.signal_name else 0
        highest = torch.tensor([number], device=device)
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        if highest.item() and not self.guard.signal_name:
            self.guard.signal_name = signal.Signals(int(highest.item())).name
            print(f"\nmpskit: {self.guard.signal_name} to another process: saving a checkpoint at the end of "
                  "this step", file=sys.stderr)  # fmt: skip

    def on_epoch_end(self, args, state, control, **kwargs):  # a stop ends the epoch: eval_strategy=epoch
        if self.guard.signal_name:
            control.should_evaluate = False
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.guard.signal_name:
            args.do_eval = False  # LLaMA-Factory's workflow evaluates after training where do_eval is set
        else:
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
