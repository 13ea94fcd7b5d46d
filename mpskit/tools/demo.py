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
from mpskit.run.quiet import is_verbose
from mpskit.rundir import RunDir, make_new_folder

STAGES = ("sft", "dpo", "foodpo")
# Small enough for a 2-core CPU, large enough that DPO's held-out reward accuracy clearly moves;
# evaluated before the first step too, so each stage shows what training changed.
DEMO_ARGS = ["model_preset=tiny", "learning_rate=5e-3", "num_train_epochs=2", "cutoff_len=128", "eval_on_start=true"]
CHAT_PROMPT = "55加1等于多少？"  # a held-out demo question (demo_pref_eval.json)
# what each stage's held-out evaluation is judged by: SFT the answers' loss, DPO the reward accuracy
NEXT_COMMANDS = ("mpskit: next:", "mpskit:      ")  # each stage's summary, but the commands: chat comes last
HELD_OUT = {"sft": "eval_loss", "dpo": "eval_rewards/accuracies", "foodpo": "eval_rewards/accuracies"}


@dataclass
class StageResult:
    stage: str
    steps: int
    final_loss: float
    held_out: tuple[float, float]  # HELD_OUT[stage] before the first step and at the end
    memory_gb: float  # the training process's peak above what it held before the model loaded
    predicted_gb: float | None
    wall_s: float
    run_dir: Path


def summarise(stage: str, run_dir: Path, wall_s: float) -> StageResult:
    run = RunDir.open(run_dir)
    log = run.log()
    losses = [row["loss"] for row in log if "loss" in row]
    evaluations = [row[HELD_OUT[stage]] for row in log if HELD_OUT[stage] in row]
    final = run.results().get(HELD_OUT[stage], math.nan)
    return StageResult(
        stage=stage,
        steps=max(row["current_steps"] for row in log),
        final_loss=losses[-1] if losses else math.nan,
        held_out=(evaluations[0] if evaluations else math.nan, final),
        memory_gb=run.record.memory.measured.get("training_gb", math.nan),
        predicted_gb=run.record.memory.predicted_training_gb,
        wall_s=wall_s,
        run_dir=run_dir,
    )


def run_stage(stage: str, hardware: str | None, log_path: Path) -> StageResult:
    """One `mpskit train` child: its mpskit lines (progress, summary) on screen, everything in log_path."""
    command = [sys.executable, "-m", "mpskit.cli", "train", f"stage={stage}", f"run_name=demo-{stage}", *DEMO_ARGS]
    if hardware:
        command += ["--hardware", hardware]
    start = time.perf_counter()
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in child.stdout:
            log.write(line)
            if (line.startswith("mpskit:") and not line.startswith(NEXT_COMMANDS)) or is_verbose():
                print(f"  {line}", end="", flush=True)
    if child.wait() != 0:
        raise MpskitError(f"demo stage {stage} failed", f"see {log_path}")
    run_dir = Path("output") / f"demo-{stage}" / "latest"
    return summarise(stage, run_dir.resolve(), time.perf_counter() - start)


def format_table(results: list[StageResult]) -> str:
    header = ("stage", "steps", "final train loss", "held-out: step 0 -> end", "peak train memory (plan)", "wall",
              "run directory")  # fmt: skip
    rows = [header]
    for r in results:
        name = HELD_OUT[r.stage].removeprefix("eval_").replace("rewards/accuracies", "reward accuracy")
        plan = f" ({r.predicted_gb:.2f})" if r.predicted_gb else ""
        rows.append(
            (
                r.stage,
                str(r.steps),
                f"{r.final_loss:.4f}",
                f"{name} {r.held_out[0]:.3f} -> {r.held_out[1]:.3f}",
                f"{r.memory_gb:.2f} GB{plan}",
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

    started = time.perf_counter()
    tiny_dir, built = ensure_preset_model()
    if built:
        print(f"mpskit demo: built the tiny model in {tiny_dir}")
    log_dir = make_new_folder(Path("output") / "demo-logs" / time.strftime("%Y%m%d-%H%M%S"))
    results = []
    for number, stage in enumerate(STAGES, 1):
        log_path = log_dir / f"{stage}.log"
        print(f"mpskit demo: {number}/{len(STAGES)} training {stage} (full log: {log_path})", flush=True)
        results.append(run_stage(stage, hardware, log_path))
    print()
    print(format_table(results))
    print(LEARNED)
    foodpo = next(result.run_dir for result in results if result.stage == "foodpo")
    print(f"\nmpskit demo: mpskit chat {os.path.relpath(foodpo)} --prompt '{CHAT_PROMPT}'", flush=True)
    print(ask(foodpo, CHAT_PROMPT, log_dir / "chat.log"))
    print(RANDOM_WEIGHTS)
    print(f"mpskit demo: done in {time.perf_counter() - started:.0f} s")
    return 0


LEARNED = (
    "held-out, on data none of the stages trained on: SFT lowers the loss of the reference answers; DPO and\n"
    "fooDPO take the reward accuracy (the share of pairs whose chosen answer gains more log-probability\n"
    "over the base model than the rejected one) from 0 before the first step, where the adapter is still\n"
    "the base model and every reward is 0, to the end figure."
)
RANDOM_WEIGHTS = (
    "(the tiny model's weights are random and its vocabulary is the demo data's characters: its answers\n"
    "are noise before and after a few seconds of training; the held-out figures above are what changed.\n"
    "With a real model: make sft-qwen, make dpo-qwen, make foodpo-qwen.)"
)


def ask(run_dir: Path, prompt: str, log_path: Path) -> str:
    """A run's adapter answers once (`mpskit chat --prompt`); its log lines go to log_path."""
    command = [sys.executable, "-m", "mpskit.cli", "chat", str(run_dir), "--prompt", prompt, "--max-new-tokens", "32"]
    with open(log_path, "w") as log:
        answer = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True)
    if answer.returncode != 0:
        raise MpskitError("the demo's chat with the fooDPO adapter failed", f"see {log_path}")
    return answer.stdout.rstrip("\n")
