"""`make demo`: a real model's story, offline, one `mpskit train` process per stage.

SmolLM2-135M-Instruct (`mpskit get-model smollm2-135m`, which `make install` runs) learns a new name
and maker from the identity set (SFT), then DPO and fooDPO train on pairs whose chosen answer is
checkably the better one. Each stage is evaluated on held-out data before its first step and at its
end, and the model answers a held-out question before SFT and after it; last, the SFT run answers it
again as a q8_0 GGUF file through llama.cpp, the file Ollama and LM Studio run.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.files import make_new_folder
from mpskit.presets import demo_data_dir, fetched_model
from mpskit.run.quiet import is_verbose
from mpskit.run.signals import STOP_SIGNALS
from mpskit.rundir.folder import RunDir
from mpskit.self_command import mpskit_command

STAGES = ("sft", "dpo", "foodpo")
MODEL_PRESET = "smollm2-135m"
# The demo's settings: short rows (about 60 tokens), batch 4, a learning rate a real model learns from in
# tens of steps; evaluated before the first step (the base model) and at the end.
COMMON = [f"model_preset={MODEL_PRESET}", "cutoff_len=256", "per_device_train_batch_size=4",
          "gradient_accumulation_steps=1", "learning_rate=1e-3", "eval_on_start=true", "logging_steps=5"]  # fmt: skip
STAGE_WORDS = {
    "sft": ["dataset=identity", "eval_dataset=identity_eval", "max_steps=40"],
    "dpo": ["dataset=checked_pref", "eval_dataset=checked_pref_eval", "max_steps=10"],
    "foodpo": ["dataset=checked_pref", "eval_dataset=checked_pref_eval", "max_steps=10"],
}
CHAT_PROMPT = "Who are you?"  # a held-out question (identity_eval.json)
GGUF_TYPE = "q8_0"  # the SFT run's file for llama.cpp, at the end
RUN_DIR_LINE = "mpskit: run directory "  # where each stage's child says which run folder is its own
INTERRUPTED = 130  # a stage's exit code when a signal stopped it (and the demo's then)
NEXT_COMMANDS = ("mpskit: next:", "mpskit:      ")  # each stage's summary, but the commands: chat comes last
# What each stage's held-out evaluation is judged by, and its name in the table: SFT the answers' loss;
# DPO and fooDPO the log-ratio gap (the reward margin with beta factored out: their betas differ) and
# the reward accuracy, which a base model's ties (every reward 0) leave at 0 before the first step.
PREFERENCE = {"eval_rewards/log_ratio_gap": "gap", "eval_rewards/accuracies": "accuracy"}
HELD_OUT = {"sft": {"eval_loss": "loss"}, "dpo": PREFERENCE, "foodpo": PREFERENCE}


def stage_words(stage: str) -> list[str]:
    """The `mpskit train` words of a demo stage (bench/real.py trains the same)."""
    return [f"stage={stage}", *COMMON, f"dataset_dir={demo_data_dir()}", *STAGE_WORDS[stage]]


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
    """One `mpskit train` child: its mpskit lines (progress, summary) on screen, everything in log_path.
    The child has its own process group, so that a signal reaches it once: the demo passes on each
    one it gets (Ctrl-C, SIGTERM, SIGHUP) and reads on until the child has saved and recorded its stop."""
    command = mpskit_command("train", *stage_words(stage), f"run_name=demo-{stage}")
    if hardware:
        command += ["--hardware", hardware]
    start, run_dir = time.perf_counter(), None
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 process_group=0)  # fmt: skip
        with _passed_on(child):
            for line in child.stdout:
                log.write(line)
                if line.startswith(RUN_DIR_LINE):
                    run_dir = Path(line[len(RUN_DIR_LINE) :].strip())
                if (line.startswith("mpskit:") and not line.startswith(NEXT_COMMANDS)) or is_verbose():
                    print(f"  {line}", end="", flush=True)
            code = child.wait()
    if code == INTERRUPTED:
        raise DemoStopped(stage)
    if code != 0 or run_dir is None:
        raise MpskitError(f"demo stage {stage} failed", f"see {log_path}")
    return summarise(stage, run_dir.resolve(), time.perf_counter() - start)


class DemoStopped(Exception):  # noqa: N818 - a stop the user asked for
    """A stage stopped by a signal; its own lines said where it stopped and how to resume it."""


@contextlib.contextmanager
def _passed_on(child: subprocess.Popen) -> Iterator[None]:
    """Within: each stop signal the demo gets goes to CHILD instead."""
    previous = {number: signal.signal(number, lambda number, frame: child.send_signal(number))
                for number in STOP_SIGNALS}  # fmt: skip
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


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
    started = time.perf_counter()
    fetched_model(MODEL_PRESET, "the demo trains the real model")
    log_dir = make_new_folder(Path("output") / "demo-logs" / time.strftime("%Y%m%d-%H%M%S"))
    results = []
    for number, stage in enumerate(STAGES, 1):
        log_path = log_dir / f"{stage}.log"
        print(f"mpskit demo: {number}/{len(STAGES)} training {stage} (full log: {log_path})", flush=True)
        try:
            results.append(run_stage(stage, hardware, log_path))
        except DemoStopped:
            print(f"mpskit demo: stopped in stage {stage}; resume it with the command above", flush=True)
            return INTERRUPTED
    print()
    print(format_table(results))
    print(LEARNED)
    sft = next(result.run_dir for result in results if result.stage == "sft")
    with ThreadPoolExecutor() as pool:  # the two chats and the export at once: each is most of all imports
        answers = {base: pool.submit(ask, sft, CHAT_PROMPT, log_dir / f"chat{'-base' if base else ''}.log", base)
                   for base in (True, False)}  # fmt: skip
        exported = pool.submit(gguf_file_of, sft, Path("output") / "demo-gguf" / log_dir.name, log_dir / "export.log")
        for base, when in ((True, "before SFT (the base model)"), (False, "after SFT")):
            command = f"mpskit chat {os.path.relpath(sft)}{' --base' if base else ''} --prompt '{CHAT_PROMPT}'"
            print(f"\nmpskit demo: {when}: {command}\n{answers[base].result()}", flush=True)
        print(f"\n(\"{CHAT_PROMPT}\" is held out: the identity set never asks it in those words.)")
        gguf = exported.result()
    command = f"mpskit chat {os.path.relpath(gguf)} --prompt '{CHAT_PROMPT}' --temperature 0"
    answer = ask(gguf, CHAT_PROMPT, log_dir / "chat-gguf.log", temperature=0)
    print(f"\nmpskit demo: the SFT run as a {GGUF_TYPE} GGUF file, in llama.cpp: {command}\n{answer}", flush=True)
    print(f"(Ollama: ollama create {gguf.name.rsplit('.', 2)[0]} -f {os.path.relpath(gguf.parent)}/Modelfile)")
    print(f"mpskit demo: done in {time.perf_counter() - started:.0f} s")
    return 0


LEARNED = (
    "held out, on data none of the stages trained on, the base model (evaluated before the first step)\n"
    "beside the trained adapter: SFT lowers the loss of the new identity's answers. DPO and fooDPO raise\n"
    "the log-ratio gap: how much more log-probability, over the base model, the chosen answer (the new\n"
    "identity, a right sum, a right capital) gains than the rejected one (the reward margin divided by\n"
    "beta, so the two compare although their betas differ). Reward accuracy is the share of pairs with a\n"
    "positive gap; the base model's ties count as 0."
)


def ask(model: Path, prompt: str, log_path: Path, base: bool = False, temperature: float | None = None) -> str:
    """A run's adapter (or its base model alone, or a GGUF file) answers once (`mpskit chat --prompt`); its
    log lines go to log_path."""
    command = mpskit_command("chat", str(model), "--prompt", prompt, "--max-new-tokens", "40")
    command += ["--base"] if base else []
    command += ["--temperature", str(temperature)] if temperature is not None else []
    with open(log_path, "w") as log:
        answer = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True)
    if answer.returncode != 0:
        raise MpskitError(f"the demo's chat with {model} failed", f"see {log_path}")
    return answer.stdout.rstrip("\n")


def gguf_file_of(run_dir: Path, out: Path, log_path: Path) -> Path:
    """The run as a GGUF file for llama.cpp, LM Studio and Ollama (`mpskit export --gguf`): its path."""
    command = mpskit_command("export", str(run_dir), "--gguf", GGUF_TYPE, "-o", str(out))
    with open(log_path, "w") as log:
        if subprocess.run(command, stdout=log, stderr=log).returncode != 0:
            raise MpskitError(f"the demo's export of {run_dir} failed", f"see {log_path}")
    return next(out.glob("*.gguf"))
