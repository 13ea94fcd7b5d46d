"""trainer_log.jsonl with every metric the trainer logged.

LLaMA-Factory's LogCallback writes a fixed handful of keys (loss, accuracy, lr, ...), dropping DPO's
rewards/margins and fooDPO's dynamic_beta. This subclass adds the rest of each log entry to the
same line. It replaces the LogCallback that run_exp appends (bends.LOG), so it writes through the same
single-worker thread pool, in order.
"""

from __future__ import annotations

import collections
import math

from llamafactory.train.callbacks import LogCallback


class FullLogCallback(LogCallback):
    def __init__(self) -> None:
        super().__init__()
        self._extras: collections.deque[dict] = collections.deque()

    def on_log(self, args, state, control, **kwargs):
        if args.should_save and self.thread_pool is not None and state.log_history:
            entry = state.log_history[-1]
            self._extras.append(
                {k: v for k, v in entry.items() if isinstance(v, int | float) and math.isfinite(v) and k != "step"}
            )
        return super().on_log(args, state, control, **kwargs)

    def _write_log(self, output_dir: str, logs: dict) -> None:
        extras = self._extras.popleft() if self._extras else {}
        super()._write_log(output_dir, {**logs, **{k: v for k, v in extras.items() if k not in logs}})

