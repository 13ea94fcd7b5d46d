"""What `mpskit train` adds to a run: its wall time and peak memory against plain `llamafactory-cli train`
on the same LLaMA-Factory YAML, on this machine.

The YAML is a short LoRA SFT of the tiny model (20 steps, batch 4, cutoff 256), with every knob mpskit's
planner could choose pinned (dtype, checkpointing, attention), so both run the same training. Each run
is a fresh process through a small launcher (gguf_export.LAUNCHER): the wall time, and the peak RSS
as the kernel keeps it for that one process (nothing is reset, no other tool's figure moves). The two
commands alternate A B, then B A, round by round. Medians and spread, and mpskit's ratios to plain
LLaMA-Factory's. Targets: wall ratio at most 1.0, peak ratio at most 1.05.

    python bench/overhead.py [--repeats 4] [--out bench/results/overhead.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gguf_export import peak_of, spread  # noqa: E402

WALL_TARGET, PEAK_TARGET = 1.0, 1.05
YAML = """\
stage: sft
do_train: true
model_name_or_path: {model}
dataset: demo_sft
dataset_dir: {data}
template: qwen
finetuning_type: lora
lora_target: all
lora_rank: 8
cutoff_len: 256
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
learning_rate: 5.0e-4
max_steps: 20
logging_steps: 5
save_steps: 1000
bf16: false
disable_gradient_checkpointing: true
flash_attn: sdpa
report_to: none
overwrite_cache: true
"""
COMMANDS = {
    "mpskit train": [sys.executable, "-m", "mpskit.cli", "train"],
    "llamafactory-cli train": [sys.executable, "-m", "llamafactory.cli", "train"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "overhead.json")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mpskit-overhead-") as folder:
        work = Path(folder)
        model = work / "model"
        subprocess.run([sys.executable, "-m", "mpskit.cli", "tiny-model", str(model)], check=True, capture_output=True)
        run_file = work / "run.yaml"
        run_file.write_text(YAML.format(model=model, data=ROOT / "data"))
        measured: dict[str, dict[str, list[float]]] = {name: {"wall_s": [], "peak_gb": []} for name in COMMANDS}
        for round_number in range(options.repeats):
            order = list(COMMANDS) if round_number % 2 == 0 else list(reversed(COMMANDS))
            for name in order:
                out = work / f"{name.split()[0]}-{round_number}"
                wall, peak, _ = peak_of([*COMMANDS[name], str(run_file), f"output_dir={out}"])
                measured[name]["wall_s"].append(wall)
                measured[name]["peak_gb"].append(peak)
                print(f"{name}: {wall:.1f} s, {peak:.2f} GB", file=sys.stderr, flush=True)
    results = {"measured": measured, "ratios": ratios(measured)}
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=2) + "\n")
    for name, figures in measured.items():
        print(f"{name:24} wall {spread(figures['wall_s'], 1)} s, peak {spread(figures['peak_gb'])} GB")
    wall, peak = results["ratios"]["wall"], results["ratios"]["peak"]
    print(f"mpskit / plain: wall {wall:.3f} (target <= {WALL_TARGET}), peak {peak:.3f} (target <= {PEAK_TARGET})")
    return 0 if wall <= WALL_TARGET and peak <= PEAK_TARGET else 1


def summary(results: dict | None = None) -> str:
    """The docs' lines (docs/measurements.md, through scripts/docs_tables.py) from the last results."""
    results = results or json.loads((ROOT / "bench" / "results" / "overhead.json").read_text())
    rows = [f"| {name} | {spread(figures['wall_s'], 1)} | {spread(figures['peak_gb'])} |"
            for name, figures in results["measured"].items()]  # fmt: skip
    ratio = results["ratios"]
    return "\n".join(["| command | wall s | peak RSS GB |", "| --- | --- | --- |", *rows, "",
                      f"mpskit over plain LLaMA-Factory: wall {ratio['wall']:.2f}x (target 1.0), "
                      f"peak {ratio['peak']:.2f}x (target 1.05)."])  # fmt: skip


def ratios(measured: dict) -> dict[str, float]:
    """mpskit's medians over plain LLaMA-Factory's."""
    ours, theirs = measured["mpskit train"], measured["llamafactory-cli train"]
    return {
        "wall": statistics.median(ours["wall_s"]) / statistics.median(theirs["wall_s"]),
        "peak": statistics.median(ours["peak_gb"]) / statistics.median(theirs["peak_gb"]),
    }


if __name__ == "__main__":
    sys.exit(main())
