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
DEMO_ARGS = ["model_preset=tiny", "num_train_epochs=2", "cutoff_len=128", "eval_on_start=true"]
CHAT_PROMPT = "55加1等于多少？"  # a held-out demo question (demo_pref_eval.json)
NEXT_COMMANDS = ("mpskit: next:", "mpskit:      ")  # each stage's summary, but the commands: chat comes last
# What each stage's held-out evaluation is judged by, and its name in the table: SFT the answers' loss;
# DPO and fooDPO the log-ratio gap (the reward margin with beta factored out: their betas differ) and
# the reward accuracy, which a base model's ties (every reward 0) leave at 0 before the first step.
PREFERENCE = {"eval_rewards/log_ratio_gap": "gap", "eval_rewards/accuracies": "accuracy"}
HELD_OUT = {"sft": {"eval_loss": "loss"}, "dpo": PREFERENCE, "foodpo": PREFERENCE}


@dataclass
class StageResult:
    stage: str
    final_loss: float
    held_out: dict[str, tuple[float, float]]  # each HELD_OUT[stage] figure of the base model and at the end
    memory_gb: float  # the training process's peak above what it held before the model loaded
    predicted_gb: float | None
    wall_s: float
    run_dir: Path


def summarise(stage: str, run_dir: Path, wall_s: float) -> StageResult:
    run = RunDir.open(run_dir)
    log = run.log()
    losses = [row["loss"] for row in log if "loss" in row]
    results = run.results()
    held_out = {}
    for key in HELD_OUT[stage]:
        evaluations = [row[key] for row in log if key in row]  # the first: eval_on_start, the base model
        held_out[key] = (evaluations[0] if evaluations else math.nan, results.get(key, math.nan))
    return StageResult(
        stage=stage,
        final_loss=losses[-1] if losses else math.nan,
        held_out=held_out,
        memory_gb=run.record.memory.measured.training_gb if run.record.memory.measured else math.nan,
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
    """The stages side by side in 80 columns (their steps are in each stage's summary above), their run
    folders below."""
    header = ("stage", "loss", "held out: base -> trained", "memory GB (plan)", "wall")
    rows = [header]
    for r in results:
        held_out = ", ".join(f"{HELD_OUT[r.stage][key]} {before:.2f} -> {after:.2f}"
                             for key, (before, after) in r.held_out.items())  # fmt: skip
        plan = f" ({r.predicted_gb:.2f})" if r.predicted_gb else ""
        rows.append((r.stage, f"{r.final_loss:.3f}", held_out, f"{r.memory_gb:.2f}{plan}", f"{r.wall_s:.0f} s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines += [""] + [f"{r.stage:6} {os.path.relpath(r.run_dir)}" for r in results]
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
    "held out, on data none of the stages trained on, the base model (evaluated before the first step)\n"
    "beside the trained adapter: SFT lowers the loss of the reference answers. DPO and fooDPO raise the\n"
    "log-ratio gap: how much more log-probability, over the base model, the chosen answer gains than the\n"
    "rejected one (the reward margin divided by beta, so the two compare although their betas differ).\n"
    "Reward accuracy is the share of pairs with a positive gap; the base model's ties count as 0."
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
