"""`mpskit doctor`: this machine, its MPS settings, and the memory model next to measured steps.

What the seeds' mps_memory_debug.py tried to be: it reports versions and whether the MPS variables
in force are valid together, whether 4-bit quantization works on the training device, then trains
the tiny model for one step at two sequence lengths and two LoRA ranks, each in a fresh process, and
prints the estimate beside what was measured."""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from pathlib import Path

from mpskit.machine.hardware import describe, installed_version, select_hardware
from mpskit.machine.mps_env import env_values, watermark_problems
from mpskit.settings.quantization import device_problems
from mpskit.trials.measure import Case, measure, write_long_data

MPS_VARIABLES = ("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO", "PYTORCH_ENABLE_MPS_FALLBACK")
PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "llamafactory", "bitsandbytes")
NF4_ERROR = 0.15  # NF4 round trips a normal weight within about 0.09 of its mean size
UNDER_ESTIMATE = 0.25  # the planner keeps 15% spare; more than this below the measurement risks running out
CASES = [Case("sft", cutoff, 2, rank, checkpointing=False, steps=1) for cutoff in (128, 512) for rank in (8, 64)]


def environment_report(environ: dict[str, str], recommended: dict[str, str]) -> tuple[list[str], list[str]]:
    """(lines, problems) for the MPS variables in force against mpskit's recommendation."""
    lines = []
    for name in MPS_VARIABLES:
        value = environ.get(name)
        advice = recommended.get(name)
        note = "" if advice is None or value == advice else f"  (mpskit would set {advice})"
        lines.append(f"{name:34} {value if value is not None else 'unset (PyTorch default)'}{note}")
    return lines, watermark_problems(environ)


def run_doctor(hardware: str | None = None, model: str | None = None) -> int:
    hw = select_hardware(hardware, probe_torch=True)
    print(f"{'python':24} {sys.version.split()[0]} on {platform.platform()}")
    described = describe(hw)
    for key, value in described:
        print(f"{key:24} {value}")
    for package in PACKAGES:
        if package not in dict(described):
            print(f"{package:24} {installed_version(package)}")

    recommended = env_values(hw)
    lines, problems = environment_report(dict(os.environ), recommended)
    print("\nMPS environment in force")
    print("\n".join(f"  {line}" for line in lines))
    print(f"  {'valid together':34} {'yes' if not problems else 'NO: ' + '; '.join(problems)}")

    print("\n4-bit bases (quantization_bit=4)")
    print(f"  {four_bit_report(hw.device, problems)}")

    print("\nmemory model against one measured step (tiny model, each in a fresh process)")
    with tempfile.TemporaryDirectory(prefix="mpskit-doctor-") as tmp:
        work = Path(tmp)
        model_dir = Path(model) if model else _tiny_model(work / "tiny")
        data = write_long_data(work / "data")
        print(f"  {'case':34} {'estimate':>9} {'measured':>9} {'error':>7}")
        for i, case in enumerate(CASES):
            row = measure(case, model_dir, data, work / f"run-{i}", hardware)
            if i == 0:
                loaded = row["parts_gb"]["weights"] + row["parts_gb"].get("lora weights", 0)
                print(f"  {'model load':34} {loaded:>8.3f}G {row['loaded_gb']:>8.3f}G")
            label = f"step: cutoff_len {case.cutoff_len}, LoRA rank {case.lora_rank}"
            print(f"  {label:34} {row['estimate_gb']:>8.3f}G {row['measured_gb']:>8.3f}G {row['error']:>+7.1%}")
            if row["error"] < -UNDER_ESTIMATE:
                problems.append(f"the memory model underestimates {label} by {-row['error']:.0%}")
    print(f"\n{verdict(problems, hw.device)}")
    return 1 if problems else 0


def four_bit_report(device: str, problems: list[str]) -> str:
    """Whether bitsandbytes quantizes to 4 bits and back on the training device; a wrong round trip
    is a problem, a machine without bitsandbytes only says why."""
    missing = device_problems({"quantization_bit": 4}, device)
    if missing:
        return f"not here: {missing[0][0]} ({missing[0][1]})"
    from mpskit.engine.quantized import round_trip

    error = round_trip(device)
    if not error < NF4_ERROR:
        problems.append(f"an NF4 round trip on {device} is off by {error:.0%} of the weights")
        return f"NF4 round trip on {device}: off by {error:.0%} of the weights (expected about 9%)"
    return f"NF4 round trip on {device}: works (mean error {error:.1%} of the weights)"


def verdict(problems: list[str], device: str) -> str:
    if problems:
        return f"verdict: {len(problems)} problem(s): {'; '.join(problems)}"
    return (f"verdict: ready to train on {device}: the MPS variables are valid together and the memory model "
            f"does not underestimate a measured step by more than {UNDER_ESTIMATE:.0%}")  # fmt: skip


def _tiny_model(out: Path) -> Path:
    from mpskit.tools.tiny import build_tiny_model

    return build_tiny_model(out)
