"""Measured training runs for `mpskit doctor` and the benches.

Each case is one `mpskit train` in a fresh process, so the process's peak memory belongs to that case
alone, on examples long enough that every sequence fills cutoff_len (the planner's worst case). The
run's own memory monitor does the measuring and mpskit.json holds the estimate next to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.plan.duration import steady_step_s
from mpskit.plan.memory import sequences_per_step
from mpskit.presets import demo_data_dir
from mpskit.rundir.folder import RunDir
from mpskit.self_command import mpskit_command
from mpskit.settings.knobs import Knobs, as_words

# Words that leave a run only its training steps: no evaluation, checkpoints or plots; a log line a step.
TIMED_ONLY = ("eval_dataset=", "eval_strategy=no", "logging_steps=1", "save_strategy=no", "plot_loss=false")


@dataclass(frozen=True)
class Case:
    stage: str
    cutoff_len: int
    batch: int
    lora_rank: int
    checkpointing: bool
    attention: str = "sdpa"
    accumulation: int = 1
    steps: int = 2
    lean_logits: bool = False
    lean_attention: bool = False
    quantization_bit: int | None = None

    def words(self) -> list[str]:
        """Every planner knob a CPU run has pinned, so the run is exactly this case."""
        knobs = Knobs(self.batch, self.cutoff_len, self.lora_rank, self.checkpointing, attention=self.attention,
                      lean_logits=self.lean_logits, lean_attention=self.lean_attention,
                      quantization_bit=self.quantization_bit)  # fmt: skip
        pinned = ("per_device_train_batch_size", "gradient_accumulation_steps", "cutoff_len", "lora_rank",
                  "disable_gradient_checkpointing", "flash_attn", "lean_logits", "lean_attention")  # fmt: skip
        pinned += ("quantization_bit",) if self.quantization_bit else ()
        return [
            f"preset={self.stage}",  # the stage preset's settings (a run of words alone is the words only)
            f"stage={self.stage}",
            f"dataset={'long_sft' if self.stage == 'sft' else 'long_pref'}",
            *as_words(knobs, self.batch * self.accumulation, pinned).split(),
            f"max_steps={self.steps}",
        ]


def write_long_data(out: Path, min_chars: int = 5000) -> Path:
    """SFT and preference examples whose prompt and answer each run past any cutoff_len here, and SFT
    examples with such prompts and answers of a word or two (long_prompt_sft)."""

    def long_text(rows: list[dict], key: str, start: int) -> str:
        parts, i = [], start
        while sum(len(p) for p in parts) < min_chars:
            row = rows[i % len(rows)]
            parts.append(" ".join(str(row[k]) for k in key.split("+") if row.get(k)))
            i += 7
        return "\n".join(parts)

    demo = demo_data_dir()
    sft = json.loads((demo / "demo_sft.json").read_text(encoding="utf-8"))
    pref = json.loads((demo / "demo_pref.json").read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {"instruction": long_text(sft, "instruction+input", i), "input": "", "output": long_text(sft, "output", i + 3)}
        for i in range(16)
    ]
    pairs = [{"instruction": long_text(pref, "instruction", i), "input": "",
              "chosen": long_text(pref, "chosen", i + 1), "rejected": long_text(pref, "rejected", i + 2)}
             for i in range(16)]  # fmt: skip
    short_answers = [{**row, "output": ("Yes.", "No.", "Paris.", "42.")[i % 4]} for i, row in enumerate(rows)]
    (out / "long_sft.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    (out / "long_prompt_sft.json").write_text(json.dumps(short_answers, ensure_ascii=False), encoding="utf-8")
    (out / "long_pref.json").write_text(json.dumps(pairs, ensure_ascii=False), encoding="utf-8")
    columns = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}
    info = {
        "long_sft": {"file_name": "long_sft.json"},
        "long_prompt_sft": {"file_name": "long_prompt_sft.json"},  # answers of a word or two
        "long_pref": {"file_name": "long_pref.json", "ranking": True, "columns": columns},
    }
    (out / "dataset_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    return out


# A measured run reaches no model hub: the benches' models and data are local.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def fresh_process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process: this mpskit first on PYTHONPATH, then whatever the
    caller's PYTHONPATH held, and EXTRA on top."""
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds the mpskit package
    pythonpath = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **(extra or {})}


def train_in_fresh_process(words: list[str], what: str, fix: str, env: dict[str, str] | None = None) -> None:
    """`mpskit train WORDS` as a new Python process (this mpskit, on its import path); one line on failure."""
    done = subprocess.run(
        mpskit_command("train", *words),
        capture_output=True,
        text=True,
        env=fresh_process_env(env),
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MpskitError(f"{what} failed: {last}", fix)


def case_words(case: Case, model: Path, data: Path, hardware: str | None = None) -> list[str]:
    """The `mpskit train` words of a case: its knobs, the model, the long data, only timed steps."""
    words = [
        *case.words(),
        f"model_name_or_path={model}",
        "template=qwen",
        f"dataset_dir={data}",
        *TIMED_ONLY,
        "memory_budget_gb=1000",  # measure even what the planner would refuse
    ]
    return [*words, f"hardware={hardware}"] if hardware else words


def measure(
    case: Case, model: Path, data: Path, out: Path, hardware: str | None = None, env: dict[str, str] | None = None
) -> dict:
    """Train the case in a fresh process (ENV added to its environment); estimate, measurement, step times."""
    words = [*case_words(case, model, data, hardware), f"output_dir={out}"]
    started = time.perf_counter()
    process_env = {**OFFLINE, **(env or {})}
    train_in_fresh_process(words, f"measured run {case}", f"see {out} and rerun it with `mpskit train`", process_env)
    memory = RunDir.open(out).record.memory
    measured = memory.measured
    tokens_per_step = sequences_per_step(case.stage, case.batch) * case.accumulation * case.cutoff_len
    return {
        "estimate_gb": memory.predicted_training_gb,
        "measured_gb": measured.training_gb,
        "error": memory.error,
        "parts_gb": memory.predicted["parts_gb"],
        "baseline_gb": measured.baseline_gb,
        "loaded_gb": measured.loaded_gb,
        "loading_peak_gb": measured.loading_peak_gb,
        "loading_estimate_gb": memory.predicted.get("loading_gb"),
        "tokens_per_second": tokens_per_step / steady_step_s(steps) if (steps := measured.step_seconds) else None,
        "seconds": round(time.perf_counter() - started, 1),
    }
