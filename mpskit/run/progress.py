"""One line per logging step on stderr, as mlx-lm prints "Tokens/sec" and "Peak mem": step/total,
loss, learning rate, tokens/s, the training memory's peak against the planner's prediction, and the
time left. It replaces transformers' progress bar and printed log dict (quiet.py). The same figures
join the step's trainer_log.jsonl entry (tokens_per_s, eta_s, memory_training_gb,
memory_predicted_gb), and the line itself the run's train.log.

The memory figure is the one mpskit.json records at the end (`memory.measured.training_gb`): the
training process's peak so far, above what it held before the model loaded (monitor.py). Tokens are
the trainer's own count (`include_num_input_tokens_seen`, which the stage presets turn on); rates
count this attempt only, so a resumed run is not credited with the steps it skipped.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from typing import TextIO

from tqdm.auto import tqdm
from transformers import TrainerCallback

from mpskit.run.monitor import GB, MemoryMonitor
from mpskit.run.summary import eval_text


class ProgressLine(TrainerCallback):
    """Runs before LLaMA-Factory's LogCallback writes the entry it adds its figures to."""

    def __init__(self, monitor: MemoryMonitor, predicted_gb: float | None, log_file: TextIO | None = None) -> None:
        self.monitor = monitor
        self.predicted_gb = predicted_gb
        self.log_file = log_file
        self.last_eval = ""
        self.started = time.perf_counter()
        self.first_step = 0
        self.first_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()
        self.first_step, self.first_tokens = state.global_step, state.num_input_tokens_seen or 0
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        entry = state.log_history[-1] if state.log_history else {}
        if "loss" in entry:
            figures = self.figures(state.global_step, state.max_steps, state.num_input_tokens_seen or 0)
            entry.update(figures)
            self._say(state, progress_text(state.global_step, state.max_steps, entry, figures))
        elif "eval_loss" in entry:
            head = f"mpskit: step {state.global_step}/{state.max_steps} held-out | "
            text = head + eval_text(entry, shutil.get_terminal_size().columns - len(head))
            if text != self.last_eval:  # the evaluation after the last step may repeat the one at it
                self._say(state, text)
            self.last_eval = text
        return control

    def _say(self, state, text: str) -> None:
        if state.is_world_process_zero:  # through tqdm, so a progress bar (where kept) is redrawn below it
            tqdm.write(text, file=sys.stderr)
            if self.log_file:
                with contextlib.suppress(OSError):  # a full disk: the checkpoint save says so, not this line
                    print(text, file=self.log_file, flush=True)

    def figures(self, step: int, total: int, tokens: int) -> dict:
        elapsed = time.perf_counter() - self.started
        done = step - self.first_step
        self.monitor.update_exact_peak()
        figures = {"memory_training_gb": round(self.monitor.training_bytes() / GB, 4)}
        if self.predicted_gb:
            figures["memory_predicted_gb"] = round(self.predicted_gb, 4)
        if tokens > self.first_tokens and elapsed > 0:
            figures["tokens_per_s"] = round((tokens - self.first_tokens) / elapsed, 1)
        if done > 0:
            figures["eta_s"] = round(elapsed / done * max(total - step, 0), 1)
        return figures


def progress_text(step: int, total: int, entry: dict, figures: dict, width: int | None = None) -> str:
    """The step's figures joined by " | " within `width` columns (the terminal's, 80 where there is
    none): the learning rate goes first, then the rate, the memory, the time left; never the step
    and the loss. trainer_log.jsonl keeps every figure."""
    width = width or shutil.get_terminal_size().columns
    fields = {"step": f"step {step}/{total}", "loss": f"loss {entry['loss']:.4f}"}  # in the line's order
    if "learning_rate" in entry:
        fields["lr"] = f"lr {entry['learning_rate']:.2e}"
    if "tokens_per_s" in figures:
        fields["rate"] = f"{figures['tokens_per_s']:,.0f} tok/s"
    plan = f" (plan {figures['memory_predicted_gb']:.2f})" if "memory_predicted_gb" in figures else ""
    fields["memory"] = f"mem {figures['memory_training_gb']:.2f} GB{plan}"
    if "eta_s" in figures:
        fields["eta"] = f"ETA {_clock(figures['eta_s'])}"
    for dropped in (None, "lr", "rate", "memory", "eta"):
        fields.pop(dropped, None)
        line = "mpskit: " + " | ".join(fields.values())
        if len(line) <= width:
            break
    return line


def _clock(seconds: float) -> str:
    """m:ss under an hour, h:mm:ss beyond."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
