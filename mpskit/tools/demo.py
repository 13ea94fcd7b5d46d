"""`make demo`: the whole pipeline offline on the tiny model, one `mpskit train` process per stage."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.rundir import RunDir

STAGES = ("sft", "dpo", "foodpo")
# Small enough for a 2-core CPU, large enough that DPO's held-out reward accuracy clearly moves.
DEMO_ARGS = ["model_preset=tiny", "learning_rate=5e-3", "num_train_epochs=2", "cutoff_len=128"]
CHAT_PROMPT = "55加1等于多少？"  # a held-out demo question (demo_pref_eval.json)


@dataclass
class StageResult:
    stage: str
    steps: int
    final_loss: float
    reward_accuracy: float | None
    peak_rss_gb: float
    wall_s: float
    run_dir: Path


def summarise(stage: str, run_dir: Path, peak_rss_gb: float, wall_s: float) -> StageResult:
    run = RunDir.open(run_dir)
    log = run.log()
    losses = [row["loss"] for row in log if "loss" in row]
    results = run.results()
    return StageResult(
        stage=stage,
        steps=max(row["current_steps"] for row in log),
        final_loss=losses[-1] if losses else math.nan,
        reward_accuracy=results.get("eval_rewards/accuracies"),
        peak_rss_gb=peak_rss_gb,
        wall_s=wall_s,
        run_dir=run_dir,
    )


def run_stage(stage: str, hardware: str | None, log_path: Path) -> StageResult:
    """One `mpskit train` child; its peak RSS comes from the kernel's own accounting (wait4)."""
    command = [sys.executable, "-m", "mpskit.cli", "train", f"stage={stage}", f"run_name=demo-{stage}", *DEMO_ARGS]
    if hardware:
        command += ["--hardware", hardware]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    wall_s = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise MpskitError(f"demo stage {stage} failed", f"see {log_path}")
    run_dir = Path("output") / f"demo-{stage}" / "latest"
    return summarise(stage, run_dir.resolve(), usage.ru_maxrss / 1024**2, wall_s)


def format_table(results: list[StageResult]) -> str:
    header = ("stage", "steps", "final train loss", "held-out reward acc", "peak RSS", "wall", "run directory")
    rows = [header]
    for r in results:
        accuracy = "-" if r.reward_accuracy is None else f"{r.reward_accuracy:.3f}"
        rows.append(
            (
                r.stage,
                str(r.steps),
                f"{r.final_loss:.4f}",
                accuracy,
                f"{r.peak_rss_gb:.2f} GB",
                f"{r.wall_s:.1f} s",
                os.path.relpath(r.run_dir),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def run_demo(hardware: str | None = None) -> int:
    from mpskit.tools.tiny import ensure_preset_model

    tiny_dir, built = ensure_preset_model()
    if built:
        print(f"mpskit demo: built the tiny model in {tiny_dir}")
    log_dir = Path("output") / "demo-logs" / time.strftime("%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for stage in STAGES:
        log_path = log_dir / f"{stage}.log"
        print(f"mpskit demo: training {stage} (log: {log_path})", flush=True)
        results.append(run_stage(stage, hardware, log_path))
    print(format_table(results))
    foodpo = next(result.run_dir for result in results if result.stage == "foodpo")
    print(f"\nmpskit demo: mpskit chat {os.path.relpath(foodpo)} --prompt '{CHAT_PROMPT}'", flush=True)
    print(ask(foodpo, CHAT_PROMPT, log_dir / "chat.log"))
    return 0


def ask(run_dir: Path, prompt: str, log_path: Path) -> str:
    """A run's adapter answers once (`mpskit chat --prompt`); its log lines go to log_path."""
    command = [sys.executable, "-m", "mpskit.cli", "chat", str(run_dir), "--prompt", prompt, "--max-new-tokens", "32"]
    with open(log_path, "w") as log:
        answer = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True)
    if answer.returncode != 0:
        raise MpskitError("the demo's chat with the fooDPO adapter failed", f"see {log_path}")
    return answer.stdout.rstrip("\n")
