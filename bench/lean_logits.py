"""Training memory and step time of lean logits against whole logits, on one written YAML.

For each case, `mpskit config` writes one LLaMA-Factory YAML (every knob pinned) for a random-
initialised model with Qwen2.5-0.5B's dimensions. Then, each run a fresh process, in turn (A B B A):
  whole  LLaMA-Factory's own `run_exp` on that YAML, as `llamafactory-cli train` runs it (for fooDPO,
         which plain LLaMA-Factory has no stage for: mpskit's fooDPO with lean_logits=false);
  lean   mpskit's trainers on the same YAML with lean logits on.
Training memory is the peak RSS minus the RSS after the imports (mpskit's memory monitor, the same in
both); step time is the median of the steps after the first. Ratios are lean / whole, per pair of
runs, and the table shows their median and spread.

    python bench/lean_logits.py [--repeats 2] [--steps 3] [--quick] [--stage sft|dpo|foodpo]

Targets: training-memory ratio <= 0.5 for DPO and fooDPO, <= 0.6 for SFT; step-time ratio <= 1.05.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpskit.measure import write_long_data  # noqa: E402

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936)  # fmt: skip
SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=1024, vocab_size=151936)  # fmt: skip
# (stage, cutoff_len, batch), checkpointing on
CASES = [("sft", 1024, 2), ("dpo", 512, 2), ("foodpo", 512, 2)]
TARGETS = {"sft": 0.6, "dpo": 0.5, "foodpo": 0.5}
STEP_TARGET = 1.05


def write_yaml(stage: str, cutoff: int, batch: int, model: Path, data: Path, out: Path, steps: int) -> Path:
    words = [
        f"stage={stage}", f"model_name_or_path={model}", "template=qwen", f"dataset_dir={data}",
        f"dataset={'long_sft' if stage == 'sft' else 'long_pref'}", "eval_dataset=", "eval_strategy=no",
        f"cutoff_len={cutoff}", f"per_device_train_batch_size={batch}", "gradient_accumulation_steps=1",
        "lora_rank=8", "disable_gradient_checkpointing=false", "flash_attn=sdpa", f"max_steps={steps}",
        "logging_steps=1", "save_strategy=no", "plot_loss=false", "memory_budget_gb=1000", "hardware=cpu",
        "pref_beta_scale=0.5" if stage == "foodpo" else "seed=42", f"output_dir={out / 'run'}",
    ]  # fmt: skip
    path = out / "llamafactory.yaml"
    done = subprocess.run([sys.executable, "-m", "mpskit.cli", "config", *words, "-o", str(path)],
                          capture_output=True, text=True, env=_env())  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"mpskit config failed: {done.stderr.strip().splitlines()[-1]}")
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def one_run(yaml_file: Path, lean: bool, out: Path) -> dict:
    """A fresh process: the imports, the monitor's baseline, then the training."""
    done = subprocess.run([sys.executable, __file__, "--worker", str(yaml_file), str(lean), str(out)],
                          capture_output=True, text=True, env=_env())  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"run failed ({yaml_file}, lean={lean}): {done.stderr[-2000:]}")
    return json.loads((out / "measured.json").read_text())


def worker(yaml_file: str, lean: str, out: str) -> None:
    import yaml

    from mpskit import lf
    from mpskit.train import hide_accelerators

    hide_accelerators()
    args = {**yaml.safe_load(Path(yaml_file).read_text()), "output_dir": out}
    run_exp = lf.import_engine()
    from mpskit.monitor import MemoryMonitor

    monitor = MemoryMonitor("cpu")  # after the imports: its baseline
    if lean == "True":
        lf.run({**args, lf.LEAN_KEY: True}, callbacks=[monitor])
    elif args["stage"] == "foodpo":
        lf.run({**args, lf.LEAN_KEY: False}, callbacks=[monitor])
    else:
        run_exp(args, callbacks=[monitor])  # LLaMA-Factory alone, as llamafactory-cli train
    measured = monitor.stop()
    steps = measured["step_seconds"][1:] or measured["step_seconds"]
    result = {"training_gb": measured["training_gb"], "step_s": statistics.median(steps)}
    (Path(out) / "measured.json").write_text(json.dumps(result))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="A B pairs per case (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run; the first is not timed")
    parser.add_argument("--quick", action="store_true", help="a 4-layer, hidden-256 model with Qwen's vocabulary")
    parser.add_argument("--stage", choices=[stage for stage, _, _ in CASES], help="this stage's case only")
    ns = parser.parse_args()
    if ns.repeats < 1:
        parser.error("--repeats must be 1 or more")
    from mpskit.tiny import build_tiny_model

    ok = True
    with tempfile.TemporaryDirectory(prefix="mpskit-lean-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        model = build_tiny_model(work / "model", ROOT / "data", dims=SMALL if ns.quick else QWEN25_05B)
        print(f"{'stage':7} {'cutoff':>6} {'batch':>5} {'whole GB':>9} {'lean GB':>8} {'memory ratio':>22} "
              f"{'whole s/step':>12} {'lean s/step':>11} {'time ratio':>22}", flush=True)  # fmt: skip
        for stage, cutoff, batch in [case for case in CASES if ns.stage in (None, case[0])]:
            case_dir = work / f"{stage}-{cutoff}-{batch}"
            case_dir.mkdir()
            yaml_file = write_yaml(stage, cutoff, batch, model, data, case_dir, ns.steps)
            rows = []
            for repeat in range(ns.repeats):  # A B, then B A: neither path always runs first
                runs = {lean: one_run(yaml_file, lean, case_dir / f"{'lean' if lean else 'whole'}-{repeat}")
                        for lean in ((False, True) if repeat % 2 == 0 else (True, False))}  # fmt: skip
                rows.append((runs[False], runs[True]))
            memory = [lean["training_gb"] / whole["training_gb"] for whole, lean in rows]
            time = [lean["step_s"] / whole["step_s"] for whole, lean in rows]
            whole_gb = statistics.median(w["training_gb"] for w, _ in rows)
            lean_gb = statistics.median(ln["training_gb"] for _, ln in rows)
            whole_s = statistics.median(w["step_s"] for w, _ in rows)
            lean_s = statistics.median(ln["step_s"] for _, ln in rows)
            print(f"{stage:7} {cutoff:>6} {batch:>5} {whole_gb:>9.2f} {lean_gb:>8.2f} {spread(memory):>22} "
                  f"{whole_s:>12.2f} {lean_s:>11.2f} {spread(time):>22}", flush=True)  # fmt: skip
            ok = ok and statistics.median(memory) <= TARGETS[stage] and statistics.median(time) <= STEP_TARGET
    print("targets: memory ratio <= 0.5 (dpo, foodpo), <= 0.6 (sft); time ratio <= 1.05; ratios are lean / whole")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
