"""Training memory and step time of lean logits against whole logits, on one written YAML.

For each case, `mpskit config` writes one LLaMA-Factory YAML (every knob pinned) for a random-
initialised model with Qwen2.5-0.5B's dimensions. Then, each run a fresh process, in turn (A B, then
B A):
  whole  LLaMA-Factory's own `run_exp` on that YAML, as `llamafactory-cli train` runs it (for fooDPO,
         which plain LLaMA-Factory has no stage for: mpskit's fooDPO with lean_logits=false);
  lean   mpskit's trainers on the same YAML with lean logits on;
  liger  with `--device cuda`, for SFT and DPO: LLaMA-Factory's own run with `enable_liger_kernel`.
Training memory is what the run adds after the imports (mpskit's memory monitor, the same in every
arm: peak RSS on the CPU, CUDA's allocator counter on a GPU); step time is the median of the steps
after the first. Ratios are against whole logits, per round of runs, and the table shows their median
and spread; `loss diff` is the largest relative difference of a logged loss from the whole run's.

    python bench/lean_logits.py [--repeats 2] [--steps 3] [--quick] [--stage sft|dpo|foodpo] [--device cuda]
                                [--out FILE.json]

A whole run writes bench/results/lean-logits-cpu.json (or -cuda.json); docs/measurements.md renders it.

Targets: training-memory ratio <= 0.5 for DPO and fooDPO, <= 0.6 for SFT; step-time ratio <= 1.05.
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

sys.path.insert(0, str(ROOT / "bench"))

import results_file  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.plan.duration import steady_step_s  # noqa: E402
from mpskit.settings.run_spec import RunSpec  # noqa: E402
from mpskit.trials.measure import OFFLINE, fresh_process_env, write_long_data  # noqa: E402

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936)  # fmt: skip
SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=1024, vocab_size=151936)  # fmt: skip
# (stage, cutoff_len, batch), checkpointing on
CASES = [("sft", 1024, 2), ("dpo", 512, 2), ("foodpo", 512, 2)]
TARGETS = {"sft": 0.6, "dpo": 0.5, "foodpo": 0.5}
STEP_TARGET = 1.05
HARDWARE = {"cpu": "cpu", "cuda": "cuda-80gb"}


def write_yaml(
    stage: str, cutoff: int, batch: int, model: Path, data: Path, out: Path, steps: int, hardware: str,
    extra: tuple[str, ...] = (),
) -> Path:
    """One case's YAML through `mpskit config`, every knob pinned; EXTRA words win over these."""
    words = [
        f"stage={stage}", f"model_name_or_path={model}", "template=qwen", f"dataset_dir={data}",
        f"dataset={'long_sft' if stage == 'sft' else 'long_pref'}", "eval_dataset=", "eval_strategy=no",
        f"cutoff_len={cutoff}", f"per_device_train_batch_size={batch}", "gradient_accumulation_steps=1",
        "lora_rank=8", "disable_gradient_checkpointing=false", "flash_attn=sdpa", f"max_steps={steps}",
        "logging_steps=1", "save_strategy=no", "plot_loss=false", "memory_budget_gb=1000",
        f"hardware={hardware}",
        "pref_beta_scale=0.5" if stage == "foodpo" else "seed=42", f"output_dir={out / 'run'}", *extra,
    ]  # fmt: skip
    path = out / "llamafactory.yaml"
    done = subprocess.run([sys.executable, "-m", "mpskit.cli", "config", *words, "-o", str(path)],
                          capture_output=True, text=True, env=fresh_process_env(OFFLINE))  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"mpskit config failed: {done.stderr.strip().splitlines()[-1]}")
    return path


def one_run(yaml_file: Path, arm: str, device: str, out: Path, bench: str = __file__) -> dict:
    """A fresh process of BENCH's worker: the imports, the monitor's baseline, then the training."""
    done = subprocess.run([sys.executable, bench, "--worker", str(yaml_file), arm, device, str(out)],
                          capture_output=True, text=True, env=fresh_process_env(OFFLINE))  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"run failed ({yaml_file}, {arm}): {done.stderr[-2000:]}")
    return json.loads((out / "measured.json").read_text())


def write_measured(monitor, out: str) -> None:
    """A worker's result: training memory, the median step after the first, the logged losses."""
    measured = monitor.stop()
    logged = [json.loads(line) for line in (Path(out) / "trainer_log.jsonl").read_text().splitlines()]
    result = {"training_gb": measured.training_gb, "step_s": steady_step_s(measured.step_seconds),
              "losses": [row["loss"] for row in logged if "loss" in row]}  # fmt: skip
    (Path(out) / "measured.json").write_text(json.dumps(result))


def worker(yaml_file: str, arm: str, device: str, out: str) -> None:
    import yaml

    from mpskit.engine import lf
    from mpskit.engine.bends import hide_accelerators

    if device == "cpu":
        hide_accelerators()
    args = {**yaml.safe_load(Path(yaml_file).read_text()), "output_dir": out}
    run_exp = lf.import_engine()
    from mpskit.run.monitor import MemoryMonitor

    monitor = MemoryMonitor(device)  # after the imports: its baseline
    if arm == "lean":
        lf.run(RunSpec.of({**args, "lean_logits": True}), callbacks=[monitor])
    elif args["stage"] == "foodpo":
        lf.run(RunSpec.of({**args, "lean_logits": False}), callbacks=[monitor])
    else:  # LLaMA-Factory alone, as llamafactory-cli train
        run_exp({**args, "enable_liger_kernel": arm == "liger"}, callbacks=[monitor])
    write_measured(monitor, out)


def loss_diff(run: dict, whole: dict) -> float:
    """The largest relative difference between the two runs' logged losses, step by step."""
    return max(abs(a - b) / abs(b) for a, b in zip(run["losses"], whole["losses"], strict=True))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def arm_row(stage: str, cutoff: int, batch: int, arm: str, rounds: list[dict]) -> dict:
    """One arm's medians over the rounds, and its ratios to whole logits per round."""
    row = {"stage": stage, "cutoff": cutoff, "batch": f"{batch} pairs" if stage != "sft" else batch, "arm": arm,
           "gb": statistics.median(r[arm]["training_gb"] for r in rounds),
           "step_s": statistics.median(r[arm]["step_s"] for r in rounds)}  # fmt: skip
    if arm != "whole":
        row["memory_ratio"] = results_file.spread([r[arm]["training_gb"] / r["whole"]["training_gb"] for r in rounds])
        row["time_ratio"] = results_file.spread([r[arm]["step_s"] / r["whole"]["step_s"] for r in rounds])
        row["loss_diff"] = max(loss_diff(r[arm], r["whole"]) for r in rounds)
    return row


COLUMNS = [Column("stage", "stage"), Column("cutoff", "cutoff"), Column("batch", "batch"), Column("arm", "arm"),
           Column("GB", "gb"), Column("s/step", "step_s", ".3g"), Column("memory ratio", "memory_ratio", ".3f"),
           Column("time ratio", "time_ratio"), Column("loss diff", "loss_diff", ".1e")]  # fmt: skip


def table(device: str, at: Path | None = None) -> str:
    """docs/measurements.md's table of one device's results."""
    results = results_file.load(f"lean-logits-{device}", at)
    return results_file.block(COLUMNS, results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="A B pairs per case (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run; the first is not timed")
    parser.add_argument("--quick", action="store_true", help="a 4-layer, hidden-256 model with Qwen's vocabulary")
    parser.add_argument("--stage", choices=[stage for stage, _, _ in CASES], help="this stage's case only")
    parser.add_argument(
        "--device", choices=list(HARDWARE), default="cpu", help="cpu (default), or cuda with a liger arm"
    )
    parser.add_argument("--out", help="the results file (default: bench/results/lean-logits-DEVICE.json when "
                        "every case ran at full size)")
    ns = parser.parse_args()
    if ns.repeats < 1:
        parser.error("--repeats must be 1 or more")
    from mpskit.tools.tiny import build_tiny_model

    rows = []
    with tempfile.TemporaryDirectory(prefix="mpskit-lean-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        model = build_tiny_model(work / "model", ROOT / "data", dims=SMALL if ns.quick else QWEN25_05B)
        for stage, cutoff, batch in [case for case in CASES if ns.stage in (None, case[0])]:
            case_dir = work / f"{stage}-{cutoff}-{batch}"
            case_dir.mkdir()
            yaml_file = write_yaml(stage, cutoff, batch, model, data, case_dir, ns.steps, HARDWARE[ns.device])
            arms = ["whole", "lean"] + (["liger"] if ns.device == "cuda" and stage != "foodpo" else [])
            rounds = []
            for repeat in range(ns.repeats):  # A B, then B A: no arm always runs first
                order = arms if repeat % 2 == 0 else arms[::-1]
                rounds.append({arm: one_run(yaml_file, arm, ns.device, case_dir / f"{arm}-{repeat}") for arm in order})
            rows += [arm_row(stage, cutoff, batch, arm, rounds) for arm in arms]
            print(results_file.render(COLUMNS, rows), flush=True)
    ok = all(row["memory_ratio"]["median"] <= TARGETS[row["stage"]] and row["time_ratio"]["median"] <= STEP_TARGET
             for row in rows if row["arm"] == "lean")  # fmt: skip
    out = ns.out or (None if ns.quick or ns.stage else results_file.path(f"lean-logits-{ns.device}"))
    if out:
        results_file.save(rows, Path(out))
    print("targets: memory ratio <= 0.5 (dpo, foodpo), <= 0.6 (sft); time ratio <= 1.05; ratios are lean / whole")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
