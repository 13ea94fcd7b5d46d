"""Live memory of a training run: a TrainerCallback that samples in a background thread.

What it reads, per device: CUDA's own peak counter (`max_memory_allocated`); on MPS, which has no
peak API, `driver_allocated_memory` sampled every few milliseconds; on the CPU the process's RSS,
with the kernel's exact high-water mark (`ru_maxrss`) so no short spike is missed, less the pages of
shared libraries faulted in after the baseline (`library_growth`). The baseline is
taken when the monitor is made, after the framework is imported and before the model loads, so
`training` is what the run itself adds; `loaded` is what the model added before the first step, and
`loading_peak` the highest it went until then. The peaks of training steps and of held-out evaluations
are kept apart, in stretches that end when training begins, at each step's end and after each
evaluation. CUDA's counter is mpskit's own to reset at each mark. The kernel's high-water mark is not:
GNU time, getrusage and a scheduler read it for the whole process. So on the CPU a stretch's peak is the
highest of its samples, or the high-water mark itself where it rose within the stretch (MPS: the
samples). It also
keeps each optimizer step's wall time, for throughput, and when training began and each evaluation
ran, for memory.png's phases.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import psutil
from transformers import TrainerCallback

from mpskit.engine.quantized import trim_heap
from mpskit.machine.allocator import trims_heap
from mpskit.rundir.record import Measured

GB = 1024**3
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _max_rss_bytes() -> int:
    """The process's RSS high-water mark: Linux's VmHWM, else ru_maxrss."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as status:
            return 1024 * int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _library_ranges() -> list[tuple[int, int]]:
    """The address ranges where shared libraries (.so files) are mapped, adjacent ones merged."""
    ranges: list[tuple[int, int]] = []
    with open("/proc/self/maps", "rb") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) < 6 or b".so" not in os.path.basename(fields[5].rstrip()):
                continue
            start, end = (int(address, 16) for address in fields[0].split(b"-"))
            if ranges and ranges[-1][1] == start:
                start = ranges.pop()[0]
            ranges.append((start, end))
    return ranges


def _library_bytes() -> int:
    """Resident pages of the shared libraries the process maps; 0 where the kernel has no page map
    (macOS). Linux's /proc/self/pagemap has 8 bytes per page, bit 63 set where the page is present:
    about 20 ms for torch's 3 GB of library mappings, where reading /proc/self/smaps takes 60 ms."""
    try:
        ranges = _library_ranges()
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return 0
    present = 0
    try:
        for start, end in ranges:
            entries = os.pread(pagemap, (end - start) // PAGE * 8, start // PAGE * 8)
            present += int(np.count_nonzero(np.frombuffer(entries, dtype="<u8") >> np.uint64(63)))
    except OSError:
        return 0
    finally:
        os.close(pagemap)
    return present * PAGE


def library_growth() -> Callable[[], int]:
    """A reader of the bytes of shared-library pages resident now and not when it was made.

    RSS counts those pages, but they are the framework's code (the backward's kernels, first run in the
    first step), not the run's memory, and how many of them it counts depends on the page cache, not on
    the run: a freshly installed venv maps about twice as many of libtorch's pages (libtorch_cpu.so:
    106 MB against 53 MB after the same import), which read as 15-30% more training memory on the tiny
    model. So the CPU's figures leave them out."""
    at_start = _library_bytes()
    return lambda: max(0, _library_bytes() - at_start)


def memory_reader(device: str):
    """(read current bytes, read peak-so-far bytes or None, read bytes not to count, reset the peak or
    None: a counter that is not mpskit's to reset) for the device."""
    import torch

    if device == "cuda":
        cuda = torch.cuda
        return cuda.memory_allocated, cuda.max_memory_allocated, lambda: 0, cuda.reset_peak_memory_stats
    if device == "mps":
        return torch.mps.driver_allocated_memory, None, lambda: 0, None
    process = psutil.Process()
    return (lambda: process.memory_info().rss), _max_rss_bytes, library_growth(), None


class MemoryMonitor(TrainerCallback):
    def __init__(self, device: str, interval_s: float = 0.02) -> None:
        """One attempt's monitor: each attempt runs in a process of its own (an out-of-memory rung goes
        on in a fresh one), so the baseline is what this process holds before the model loads."""
        self.device = device
        self._read, self._read_peak, self._read_uncounted, self._reset_peak = memory_reader(device)
        self.baseline = self._read()
        self.uncounted = 0  # bytes in the readings that are not the run's, as of the last count
        self._uncounted_loading = 0  # as counted when training began
        self.samples: list[tuple[float, int]] = []  # (seconds since start, bytes), one per 0.25 s at most
        self.peak = self.baseline
        self.loaded = self.baseline  # after the model loads, before the first step
        self.loading_peak = self.baseline  # the highest until then (reading the data, loading the model)
        self.stretch_peak = self.baseline  # the highest since the last mark (train begin, a step's end, an evaluation)
        self.step_peak: int | None = None  # the highest of the stretches that ended a training step
        self.eval_peak: int | None = None  # the highest of those that ended an evaluation
        self.step_ends: list[float] = []
        self.train_began_s: float | None = None  # seconds since the monitor started
        self.eval_spans_s: list[tuple[float, float]] = []
        self._eval_start: float | None = None
        self._last_exact = self._read_peak() if self._read_peak else 0
        self._started = time.perf_counter()
        # a sample is read and counted whole on one side of a mark: one read before a mark's heap trim and
        # counted after it would give the evaluation that follows the training step's peak
        self._marking = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)
        self._thread.start()

    def _sample(self, interval_s: float) -> None:
        last_kept = -1.0
        while not self._stop.wait(interval_s):
            with self._marking:
                self._observe(self._read(), keep_after=last_kept + 0.25)
            if self.samples:
                last_kept = self.samples[-1][0]

    def _observe(self, value: int, keep_after: float = 0.0) -> None:
        now = time.perf_counter() - self._started
        if self._read_peak is None:  # no exact high-water mark (MPS): the samples make the figure
            self.peak = max(self.peak, value)
        self.stretch_peak = max(self.stretch_peak, value - self.uncounted)
        if now >= keep_after:
            self.samples.append((now, value))

    def update_exact_peak(self) -> None:
        """Counts the device's own high-water mark when it rose above every one seen, and then what in
        the readings is not the run's: as of the peak, not after it (libraries a later save or
        evaluation first uses were not in it). The stretch's peak is its own mark's where mpskit resets
        the mark (CUDA), else the mark where it rose within the stretch; less what was not the run's as
        last counted."""
        if self._read_peak is None:
            return
        value = self._read_peak()
        rose = value > self._last_exact
        if rose:
            self.uncounted = self._read_uncounted()
            # counting reads the page map into arrays of its own, which can raise the mark past `value`:
            # that rise is this one's, not the next stretch's (a 4-bit run's evaluation took the step's peak)
            self._last_exact = max(value, self._read_peak())
            self.peak = max(self.peak, value - self.uncounted)
            self._observe(value)
        if rose or self._reset_peak:
            self.stretch_peak = max(self.stretch_peak, value - self.uncounted)

    def _mark(self, evaluation_next: bool = False) -> int:
        """The peak of the stretch that ends now; the next stretch starts from the memory now. Before an
        evaluation on the CPU, glibc hands back the free pages the training steps left in the heap
        (they are the process's RSS until then, and the evaluation's peak would begin at the step's),
        so the evaluation's figure is what it holds itself."""
        with self._marking:
            self.update_exact_peak()
            ended = self.stretch_peak
            if evaluation_next and trims_heap(self.device):
                trim_heap()
            if self._reset_peak:
                self._reset_peak()
            self.stretch_peak = self._read() - self.uncounted
        return ended

    def _now(self) -> float:
        return time.perf_counter() - self._started

    def training_bytes(self) -> int:
        """What the run added at its highest so far."""
        return self.peak - self.baseline

    def on_train_begin(self, args, state, control, **kwargs):
        self.uncounted = self._read_uncounted()
        self.loaded = self._read() - self.uncounted
        self.update_exact_peak()
        self.loading_peak = self.peak
        self._uncounted_loading = self.uncounted
        self._mark(evaluation_next=bool(args.eval_on_start))
        self.step_ends.append(time.perf_counter())
        self.train_began_s = self._now()
        return control

    def on_prediction_step(self, args, state, control, **kwargs):
        if self._eval_start is None:
            self._eval_start = self._now()
        return control

    def on_evaluate(self, args, state, control, **kwargs):
        if self._eval_start is not None:
            self.eval_spans_s.append((round(self._eval_start, 2), round(self._now(), 2)))
        self._eval_start = None
        self.eval_peak = max(self.eval_peak or 0, self._mark())
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        """An evaluation at the epoch's end (eval_strategy=epoch, the stage presets') starts, as one
        after a step does, from the heap handed back: the flow callback asks for it here, not at the
        step's end."""
        if control.should_evaluate:
            self._mark(evaluation_next=True)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        """So does the evaluation LLaMA-Factory runs after training (do_eval)."""
        self._mark(evaluation_next=True)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())
        self.step_peak = max(self.step_peak or 0, self._mark(evaluation_next=control.should_evaluate))
        return control

    def stop(self) -> Measured:
        """Stop sampling; the measured figures in GB."""
        self._stop.set()
        self._thread.join()
        self.update_exact_peak()
        return Measured(
            device=self.device,
            baseline_gb=round(self.baseline / GB, 4),
            peak_gb=round(self.peak / GB, 4),
            training_gb=round(self.training_bytes() / GB, 4),
            loaded_gb=round((self.loaded - self.baseline) / GB, 4),
            loading_peak_gb=round((self.loading_peak - self.baseline) / GB, 4),
            step_gb=self._above_baseline(self.step_peak),
            eval_gb=self._above_baseline(self.eval_peak),
            libraries_gb=round(self.uncounted / GB, 4),
            step_seconds=[round(b - a, 4) for a, b in itertools.pairwise(self.step_ends)],
            train_began_s=None if self.train_began_s is None else round(self.train_began_s, 2),
            eval_spans_s=[list(span) for span in self.eval_spans_s],
            samples_gb=self.kept_samples(),
        )

    def _above_baseline(self, peak: int | None) -> float | None:
        return None if peak is None else round((peak - self.baseline) / GB, 4)

    def kept_samples(self, points: int = 300) -> list[list[float]]:
        """[seconds, GB above the baseline] for memory.png: the highest sample of each of at most
        `points` equal stretches of time, so no peak is smoothed away."""
        if not self.samples:
            return []
        end = self.samples[-1][0] or 1.0
        kept: dict[int, tuple[float, int]] = {}
        for seconds, value in self.samples:
            bucket = min(int(seconds / end * points), points - 1)
            if bucket not in kept or value > kept[bucket][1]:
                kept[bucket] = (seconds, value)
        return [[round(t, 2), round((v - self._uncounted_at(t) - self.baseline) / GB, 4)] for t, v in kept.values()]

    def _uncounted_at(self, seconds: float) -> int:
        if self.train_began_s is None or seconds >= self.train_began_s:
            return self.uncounted
        return self._uncounted_loading
