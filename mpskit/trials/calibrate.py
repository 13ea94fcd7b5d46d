"""`mpskit calibrate`: this machine's step-time figures, fitted to real steps of the real model.

A hardware profile's figures hold for the machine they were measured on: the same steps of the real
model ran 1.2 to 2.2 times as fast on one 2-core CPU as on another (docs/real-model.md). Calibrating
trains CASES of the real model (SmolLM2-135M, `mpskit get-model smollm2-135m`), each in a fresh
`mpskit train` process for one warm-up step and PROBE_STEPS timed ones with no evaluation or
checkpoint, fits the duration model's figures for 16-bit checkpoints and 4-bit bases to their steady
steps (time_fit.py) and keeps them for this machine (machine/calibration.py): from then on a plan on
this machine, without --hardware, takes them. Float32's rate and the fixed cost of a micro-step stay
the device's figures (a bf16 checkpoint's steps cannot tell them apart from the fitted ones).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from mpskit.machine.calibration import save_figures
from mpskit.machine.hardware import detect
from mpskit.plan.advice import plan_run
from mpskit.plan.duration import steady_step_s, throughput_for
from mpskit.presets import demo_data_dir, fetched_model
from mpskit.rundir.folder import RunDir
from mpskit.settings.knobs import Knobs
from mpskit.settings.resolve import resolve
from mpskit.settings.run_words import read_run_words
from mpskit.temporary import private_folder
from mpskit.trials.measure import OFFLINE, TIMED_ONLY, train_in_fresh_process, write_long_data
from mpskit.trials.probe import PROBE_STEPS
from mpskit.trials.time_fit import FITTED, TimedStep, fit_figures, predicted_step_s

PRESET = "smollm2-135m"


@dataclass(frozen=True)
class Case:
    """One timed setting: rows of about 60 tokens (the project's identity and preference sets) or
    prompts that fill cutoff_len (long_prompt_sft), 16 bits or 4, one reference model or none."""

    stage: str
    dataset: str
    cutoff_len: int
    batch: int
    bits: int = 16

    @property
    def name(self) -> str:
        return f"{self.stage} {self.bits}-bit {self.dataset} {self.cutoff_len}x{self.batch}"


# Each fitted figure moves at least two of them: short and long rows, with and without 4 bits, DPO's
# second forward. bench/real.py holds the figures out on other settings.
CASES = [
    Case("sft", "identity", 256, 4),
    Case("sft", "long_prompt_sft", 512, 2),
    Case("dpo", "checked_pref", 256, 4),
    Case("sft", "identity", 256, 4, bits=4),
    Case("sft", "long_prompt_sft", 512, 2, bits=4),
]


def case_words(case: Case, data_dirs: dict[str, Path]) -> list[str]:
    """The case's `mpskit train` words on this machine: every memory knob pinned, only timed steps."""
    words = [
        f"preset={case.stage}", f"stage={case.stage}", f"model_preset={PRESET}",
        f"dataset_dir={data_dirs[case.dataset]}", f"dataset={case.dataset}", f"cutoff_len={case.cutoff_len}",
        f"per_device_train_batch_size={case.batch}", "gradient_accumulation_steps=1", "lora_rank=8",
        "disable_gradient_checkpointing=true", f"max_steps={1 + PROBE_STEPS}", *TIMED_ONLY, "memory_budget_gb=1000",
    ]  # fmt: skip
    return words + (["quantization_bit=4"] if case.bits == 4 else [])


def timed_step(case: Case, data_dirs: dict[str, Path], out: Path) -> TimedStep:
    """Train the case in a fresh process; its setting as planned, with the knobs it trained with."""
    words = case_words(case, data_dirs)
    print(f"mpskit: calibrate: {case.name}, {1 + PROBE_STEPS} steps", file=sys.stderr, flush=True)
    train_in_fresh_process([*words, f"output_dir={out}"], f"calibration case {case.name}",
                           "run `mpskit train` with its words to see the whole message", OFFLINE)  # fmt: skip
    memory = RunDir.open(out).record.memory
    run = resolve(read_run_words(words).values)
    plan = plan_run(run)
    return TimedStep(run.args, run.stage, plan.dims, Knobs(**memory.knobs), plan.effective_batch, plan.lengths,
                     steady_step_s(memory.measured.step_seconds))  # fmt: skip


def calibrate() -> tuple[Path, dict, list[dict]]:
    """Time CASES here, fit the figures, keep them: (where they are kept, the figures, each case's step)."""
    fetched_model(PRESET, "calibrating times the real model")
    hw = detect()
    work = private_folder("mpskit-calibrate-")  # removed at exit, SIGTERM included
    data_dirs = {"identity": demo_data_dir(), "checked_pref": demo_data_dir(),
                 "long_prompt_sft": write_long_data(work / "data")}  # fmt: skip
    steps = [timed_step(case, data_dirs, work / f"case-{i}") for i, case in enumerate(CASES)]
    device_figures = throughput_for({}, hw.device, hw.device)  # the device's own, never a calibration's
    source = (f"measured on this machine by `mpskit calibrate` on {time.strftime('%Y-%m-%d')} (16- and 4-bit "
              f"steps of the real model; float32's figures: {device_figures.source})")
    fitted = fit_figures(steps, device_figures, source, hw.device)
    rows = [{"case": case.name, "measured_s": round(step.seconds, 4),
             "fitted_s": round(predicted_step_s(step, fitted, hw.device), 4)}
            for case, step in zip(CASES, steps, strict=True)]  # fmt: skip
    figures = {key: value for key, value in asdict(fitted).items() if value is not None}
    return save_figures(hw.kind, hw.chip, figures, rows), figures, rows


def report(path: Path, figures: dict, rows: list[dict]) -> list[str]:
    lines = [f"{row['case']:32} {row['measured_s']:7.3f} s a step measured, {row['fitted_s']:7.3f} fitted "
             f"({(row['fitted_s'] - row['measured_s']) / row['measured_s']:+.0%})" for row in rows]  # fmt: skip
    lines.append("figures: " + ", ".join(f"{name} {figures[name]:.3g}" for name in FITTED if name in figures))
    lines.append(f"kept for this machine in {path}: `mpskit plan` and `mpskit train` here take them")
    return lines
