"""One line per logging step on stderr, as mlx-lm prints "Tokens/sec" and "Peak mem": step/total,
loss, tokens/s, the training memory's peak against the planner's prediction, and the time left.
The same figures join the step's trainer_log.jsonl entry (tokens_per_s, eta_s, memory_training_gb,
memory_predicted_gb). Tokens are the trainer's own count (`include_num_input_tokens_seen`, which the
stage presets turn on); rates count this attempt only, so a resumed run is not credited with the
steps it skipped.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

from tqdm.auto import tqdm
from transformers import TrainerCallback

from mpskit.run.monitor import GB, MemoryMonitor


class ProgressLine(TrainerCallback):
    """Runs after the MemoryMonitor (it reads its peak), before LLaMA-Factory's LogCallback writes."""

    def __init__(self, monitor: MemoryMonitor, predicted_gb: float | None) -> None:
        self.monitor = monitor
        self.predicted_gb = predicted_gb
        self.started = time.perf_counter()
        self.first_step = 0
        self.first_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()
        self.first_step, self.first_tokens = state.global_step, state.num_input_tokens_seen or 0
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        entry = state.log_history[-1] if state.log_history else {}
        if "loss" not in entry:  # an evaluation's entry
            return control
        figures = self.figures(state.global_step, state.max_steps, state.num_input_tokens_seen or 0)
        entry.update(figures)
        if state.is_world_process_zero:  # through tqdm, so the trainer's progress bar is redrawn below it
            tqdm.write(progress_text(state.global_step, state.max_steps, entry["loss"], figures), file=sys.stderr)
        return control

    def figures(self, step: int, total: int, tokens: int) -> dict:
        elapsed = time.perf_counter() - self.started
        done = step - self.first_step
        figures = {"memory_training_gb": round((self.monitor.peak - self.monitor.baseline) / GB, 4)}
        if self.predicted_gb:
            figures["memory_predicted_gb"] = round(self.predicted_gb, 4)
        if tokens > self.first_tokens and elapsed > 0:
            figures["tokens_per_s"] = round((tokens - self.first_tokens) / elapsed, 1)
        if done > 0:
            figures["eta_s"] = round(elapsed / done * max(total - step, 0), 1)
        return figures


def progress_text(step: int, total: int, loss: float, figures: dict) -> str:
    parts = [f"step {step}/{total}", f"loss {loss:.4f}"]
    if "tokens_per_s" in figures:
        parts.append(f"{figures['tokens_per_s']:,.0f} tokens/s")
    memory = f"peak {figures['memory_training_gb']:.2f} GB"
    if "memory_predicted_gb" in figures:
        memory += f" (predicted {figures['memory_predicted_gb']:.2f})"
    parts.append(memory)
    if "eta_s" in figures:
        parts.append(f"ETA {timedelta(seconds=round(figures['eta_s']))}")
    return "mpskit: " + " | ".join(parts)
