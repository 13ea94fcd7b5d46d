"""quantize_embeddings on the CPU: a 4-bit base with its embeddings and output layer packed too, against
a 4-bit base alone (the stand-in for MPS: bitsandbytes packs the same NF4).

The model is a random Qwen2-architecture one shaped like Qwen2.5-0.5B's vocabulary but untied: input
embeddings and output layer of 151,936 x 896 each, 4 decoder layers (FFN 4864), the tiny model's
tokenizer, saved in bf16 shards of 100 MB (bench/qlora.py's bf16_shards). Each case is SFT at cutoff
256, batch 2, LoRA rank 8 on every linear layer, checkpointing on, bf16, held-out evaluations after
steps 2 and 4, in a fresh `mpskit train` process; each round runs both arms in turn (A B, then B A).
From mpskit.json (RSS above the imports, the memory monitor's figures): the run's peak (loading
included), its training steps' and evaluations' peaks against the plan's, and the steady step.
Prints medians and spread over the rounds, and the share of what packing the two tables can save
(2 bytes a weight -> 0.5625) that the measured peak saves.
Target: that share at least 70%; the plan within the memory model's targets (median 5%, max 12%).

    python bench/packed_vocab.py [--repeats 3] [--out FILE.json]

It writes bench/results/packed-vocab.json; docs/quantized.md renders it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import results_file  # noqa: E402  (bench/, the script's own folder)
from qlora import bf16_shards  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.errors import MpskitError  # noqa: E402
from mpskit.plan.duration import steady_step_s  # noqa: E402
from mpskit.plan.memory import PACK_BLOCK  # noqa: E402
from mpskit.rundir.folder import RunDir  # noqa: E402
from mpskit.trials.measure import OFFLINE, train_in_fresh_process, write_long_data  # noqa: E402

DIMS = dict(hidden_size=896, num_hidden_layers=4, num_attention_heads=14, num_key_value_heads=2,
            intermediate_size=4864, vocab_size=151936, tie_word_embeddings=False)  # fmt: skip
GIB = 1024**3
SHARE_TARGET = 0.70
MEMORY_TARGETS = (0.05, 0.12)
ARMS = {"4-bit": [], "4-bit packed": ["quantize_embeddings=true"]}
FIGURES = {"training_gb": "the run's peak", "step_gb": "training step", "eval_gb": "evaluation",
           "loading_peak_gb": "loading", "step_s": "step time s"}  # fmt: skip
COLUMNS = [Column("", "figure"), Column("4-bit", "4-bit", ".3f"), Column("4-bit, tables packed", "4-bit packed", ".3f"),
           Column("packed / 4-bit", "ratio")]  # fmt: skip
MOMENTS = {"step": "training steps", "eval": "evaluations", "loading": "loading"}


def summary(results: dict) -> str:
    """What packing saved, and the plan's errors."""
    errors = results["plan_errors"]
    held = [abs(errors[arm][moment]) for arm in ARMS for moment in ("step", "eval")]
    said = "; ".join(f"{MOMENTS[moment]} {errors['4-bit'][moment]:+.1%} (4-bit) and "
                     f"{errors['4-bit packed'][moment]:+.1%} (packed)" for moment in MOMENTS)  # fmt: skip
    saved, savable = results["saved_gb"], results["savable_gb"]
    return (f"Packing saved {saved:.3f} GB of the run's peak: {saved / savable:.0%} of the {savable:.3f} GB "
            f"that packing the two tables can save (target {SHARE_TARGET:.0%}). "
            f"The plan against the medians: {said}. Steps and evaluations together: median "
            f"{statistics.median(held):.1%}, max {max(held):.1%} (targets {MEMORY_TARGETS[0]:.0%} and "
            f"{MEMORY_TARGETS[1]:.0%}).")  # fmt: skip


def table(at: Path | None = None) -> str:
    """docs/quantized.md's table."""
    results = results_file.load("packed-vocab", at)
    return results_file.block(COLUMNS, results, summary(results))


def run_case(model: Path, data: Path, out: Path, extra: list[str]) -> dict:
    words = [
        "stage=sft", f"model_name_or_path={model}", "template=qwen", f"dataset_dir={data}", "dataset=long_sft",
        "eval_dataset=long_sft", "eval_strategy=steps", "eval_steps=2", "per_device_eval_batch_size=2",
        "cutoff_len=256", "per_device_train_batch_size=2", "gradient_accumulation_steps=1", "lora_rank=8",
        "lora_target=all", "disable_gradient_checkpointing=false", "bf16=true", "max_steps=4", "logging_steps=1",
        "save_strategy=no", "plot_loss=false", "memory_budget_gb=1000", "quantization_bit=4", f"output_dir={out}",
        *extra,
    ]  # fmt: skip
    train_in_fresh_process(words, f"bench run {extra or '4-bit'}", f"see {out}", OFFLINE)
    memory = RunDir.open(out).record.memory
    measured, predicted = memory.measured, memory.predicted
    return {
        "training_gb": measured.training_gb,
        "step_gb": measured.step_gb,
        "step_plan_gb": predicted.get("step_gb"),
        "eval_gb": measured.eval_gb,
        "eval_plan_gb": predicted.get("evaluation_gb"),
        "loading_peak_gb": measured.loading_peak_gb,
        "loading_plan_gb": predicted.get("loading_gb"),
        "step_s": steady_step_s(measured.step_seconds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both arms (default 3)")
    parser.add_argument("--out", default=str(results_file.path("packed-vocab")), help="the results file")
    ns = parser.parse_args()
    if ns.repeats < 1:
        parser.error("--repeats must be at least 1")
    with tempfile.TemporaryDirectory(prefix="mpskit-bench-packed-") as tmp:
        bf16_shards(Path(tmp) / "model", DIMS)
        model, data = Path(tmp) / "model" / "bf16", write_long_data(Path(tmp) / "data")
        work = Path(tmp)
        rounds = []
        for i in range(ns.repeats):
            order = list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]
            figures = {arm: run_case(model, data, work / f"run-{i}-{n}", ARMS[arm]) for n, arm in enumerate(order)}
            rounds.append(figures)
            print(f"round {i + 1}: " + "; ".join(f"{arm} {json.dumps(figures[arm])}" for arm in ARMS), flush=True)
    tables = 2 * DIMS["vocab_size"] * DIMS["hidden_size"]
    savable_gb = tables * (2 - (0.5 + 4 / PACK_BLOCK)) / GIB
    shape = f"{DIMS['vocab_size']:,} x {DIMS['hidden_size']}"
    print(f"\nmodel: two untied {shape} tables, {savable_gb:.3f} GB that packing them in 4 bits can save")
    rows = results_file.arm_rows(rounds, FIGURES, "4-bit packed", "4-bit")
    plan_errors = {arm: {} for arm in ARMS}  # the loading peak is shown, not held to the targets
    for arm in ARMS:
        for moment in MOMENTS:
            measured = statistics.median(r[arm]["loading_peak_gb" if moment == "loading" else f"{moment}_gb"]
                                         for r in rounds)  # fmt: skip
            plan_errors[arm][moment] = (rounds[0][arm][f"{moment}_plan_gb"] - measured) / measured
    saved = statistics.median(r["4-bit"]["training_gb"] - r["4-bit packed"]["training_gb"] for r in rounds)
    results = {"rows": rows, "plan_errors": plan_errors, "saved_gb": saved, "savable_gb": savable_gb}
    print(results_file.render(COLUMNS, rows))
    print(summary(results))
    results_file.save(rows, Path(ns.out), plan_errors=plan_errors, saved_gb=saved, savable_gb=savable_gb, rounds=rounds)
    held = [abs(plan_errors[arm][moment]) for arm in ARMS for moment in ("step", "eval")]
    met = statistics.median(held) <= MEMORY_TARGETS[0] and max(held) <= MEMORY_TARGETS[1]
    return 0 if saved / savable_gb >= SHARE_TARGET and met else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MpskitError as err:
        print(f"mpskit: error: {err}", file=sys.stderr)
        sys.exit(2)
