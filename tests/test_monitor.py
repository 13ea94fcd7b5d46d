"""The memory monitor hands the heap's free pages back before every evaluation, whatever asks for it:
a step's end (eval_strategy=steps), an epoch's end (eval_strategy=epoch, the stage presets'), or the
end of training (LLaMA-Factory's do_eval). Otherwise an evaluation is measured on top of the heap the
training steps left, and holds it."""

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT

from mpskit.run import monitor


def test_the_heap_is_handed_back_before_every_evaluation_and_only_then(monkeypatch):
    from transformers import TrainerControl

    trims = []
    monkeypatch.setattr(monitor, "trim_heap", lambda: trims.append(1))
    watch = monitor.MemoryMonitor("cpu")
    args, state = SimpleNamespace(eval_on_start=False), SimpleNamespace()
    try:
        watch.on_train_begin(args, state, TrainerControl())
        watch.on_step_end(args, state, TrainerControl())
        watch.on_epoch_end(args, state, TrainerControl())
        assert trims == []
        watch.on_step_end(args, state, TrainerControl(should_evaluate=True))
        assert len(trims) == 1
        watch.on_epoch_end(args, state, TrainerControl(should_evaluate=True))
        assert len(trims) == 2
        watch.on_train_end(args, state, TrainerControl())
        assert len(trims) == 3
    finally:
        watch.stop()


def test_a_sample_read_before_the_heap_is_handed_back_is_not_counted_after(monkeypatch):
    """The sampler reads RSS, then counts it: a read before the mark's trim, counted after the mark, gave a
    4-bit run's evaluation the training step's peak (bench/real.py measured 0.60 GB for an evaluation
    that held 0.24 GB). Here each of the sampler's reads takes 50 ms, so one always straddles the mark."""
    handed_back, marker = threading.Event(), threading.get_ident()

    def rss() -> int:
        value = 100 if handed_back.is_set() else 900
        if threading.get_ident() != marker:
            time.sleep(0.05)
        return value

    monkeypatch.setattr(monitor, "memory_reader", lambda device: (rss, lambda: 0, lambda: 0, None))
    monkeypatch.setattr(monitor, "trims_heap", lambda device: True)
    monkeypatch.setattr(monitor, "trim_heap", handed_back.set)
    watch = monitor.MemoryMonitor("cpu", interval_s=0.001)
    try:
        time.sleep(0.1)
        assert watch._mark(evaluation_next=True) == 900  # the training stretch
        time.sleep(0.2)
        assert watch._mark() == 100  # the evaluation's: only what was read after the trim
    finally:
        watch.stop()


def test_the_mark_the_monitor_raises_itself_is_not_the_next_stretchs(monkeypatch):
    """Counting the library pages at a new high-water mark reads the page map into arrays, which can raise
    the kernel's mark a little more. The evaluation after a 4-bit run's steps (whose RSS is highest at
    the step's end) then saw a rise and took the step's peak: bench/real.py read 0.60 GB for an
    evaluation whose RSS stayed under 0.27 GB."""
    memory = {"rss": 900, "mark": 900}

    def count_library_pages() -> int:
        memory["mark"] += 5  # the page map's arrays
        return 0

    monkeypatch.setattr(monitor, "memory_reader", lambda device: (lambda: memory["rss"], lambda: memory["mark"],
                                                                  count_library_pages, None))  # fmt: skip
    monkeypatch.setattr(monitor, "trim_heap", lambda: memory.update(rss=100))
    watch = monitor.MemoryMonitor("cpu", interval_s=3600)
    try:
        memory["mark"] = 1000  # the training step's peak
        assert watch._mark(evaluation_next=True) == 1000
        assert watch._mark() == 100  # the evaluation's own
    finally:
        watch.stop()


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/usr/bin/time").is_file() or sys.platform != "linux", reason="GNU time (Linux)")
def test_gnu_time_sees_a_peak_at_least_the_records(tmp_path, tiny_model):
    """The kernel's high-water mark is every outside tool's figure (GNU time, getrusage, a scheduler):
    the monitor never resets it, so the whole process's peak as they read it is at least the peak the
    run recorded with the shared libraries' pages it leaves out. The plan holds those pages. And at
    most that, nearly: the C libraries' exit pages in nothing more (process_exit.py)."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "mpskit.cli", "train", "preset=sft",
               f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "max_steps=2", "eval_steps=1",
               "run_name=timed", "--hardware", "cpu"]  # fmt: skip
    timed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert timed.returncode == 0, timed.stderr[-3000:]
    [kib] = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", timed.stderr)
    record = json.loads(next((tmp_path / "output" / "timed").glob("*/mpskit.json")).read_text())
    measured = record["memory"]["measured"]
    assert measured["eval_gb"] is not None and measured["step_gb"] is not None
    recorded = (measured["peak_gb"] + measured["libraries_gb"]) * monitor.GB
    assert 0.999 * recorded <= int(kib) * 1024 <= 1.02 * recorded
    assert 0 < measured["libraries_gb"] <= 1.5 * record["memory"]["predicted"]["libraries_gb"]


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="Linux's VmHWM")
def test_the_monitor_leaves_the_kernels_high_water_mark_alone():
    """A peak that came and went before the marks (a model loading, say) stays in VmHWM through every
    mark the monitor makes: it used to reset it (clear_refs), and outside tools then read only the
    last stretch."""
    from transformers import TrainerControl

    ballast = bytearray(512 * 1024**2)
    ballast[:: 4096] = b"x" * len(ballast[:: 4096])  # every page touched: resident
    with_ballast = monitor._max_rss_bytes()
    del ballast
    watch = monitor.MemoryMonitor("cpu")
    args, state = SimpleNamespace(eval_on_start=True), SimpleNamespace()
    try:
        watch.on_train_begin(args, state, TrainerControl())
        watch.on_step_end(args, state, TrainerControl(should_evaluate=True))
        watch.on_evaluate(args, state, TrainerControl())
        watch.on_train_end(args, state, TrainerControl())
    finally:
        measured = watch.stop()
    assert monitor._max_rss_bytes() >= 0.99 * with_ballast  # the kernel counts RSS per thread, to some pages
    assert measured.step_gb is not None and measured.eval_gb is not None


def test_the_library_pages_counted_are_those_the_kernels_smaps_lists():
    """The page map's count of resident library pages (what the CPU's figures leave out) is the sum
    of the Rss of every .so mapping in /proc/self/smaps, as psutil reads it, within a few pages."""
    import os

    import psutil

    if not Path("/proc/self/pagemap").exists():
        pytest.skip("no /proc page map: the count is 0 on this system (macOS)")
    counted = monitor._library_bytes()
    listed = sum(r.rss for r in psutil.Process().memory_maps() if ".so" in os.path.basename(r.path))
    assert listed > 10 * 2**20  # torch's libraries are mapped
    assert abs(counted - listed) <= 16 * monitor.PAGE
