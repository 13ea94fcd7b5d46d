"""The planner's choice against hand settings and against an exhaustive search, all measured here.

For one memory budget, the task (SFT, cutoff_len 256, LoRA rank 4, effective batch 8) is trained with
every setting of the planner's speed knobs (micro-batch with accumulation, checkpointing, attention),
each in a fresh process, measuring peak memory and tokens/s. Then it compares:
  - the planner's choice (made from the estimate alone, before any of this ran),
  - the seeds' hand setting: batch 1, checkpointing on (cutoff 256, rank 4),
  - the fastest setting whose measured peak fits the budget.

    python bench/planner.py [--budget-gb 3.0] [--model mid] [--steps 3]

Targets: the choice's measured peak within the budget; its tokens/s at least 90% of the best.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from memory_accuracy import MODELS  # noqa: E402

from mpskit.hardware import load_hardware  # noqa: E402
from mpskit.measure import Case, measure, write_long_data  # noqa: E402
from mpskit.memory import dims_from_mapping  # noqa: E402
from mpskit.planner import plan  # noqa: E402
from mpskit.tiny import build_tiny_model  # noqa: E402

EFFECTIVE_BATCH, CUTOFF, RANK = 8, 256, 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-gb", type=float, default=3.0)
    parser.add_argument("--model", default="mid", choices=[m for m in MODELS if m != "tiny"])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per setting (the first is warm-up)")
    ns = parser.parse_args()

    shape = MODELS[ns.model]
    dims = dims_from_mapping(shape)
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": EFFECTIVE_BATCH}
    args.update(cutoff_len=CUTOFF, lora_rank=RANK)
    pinned = {"cutoff_len", "lora_rank", "bf16", "fp16"}
    choice = plan("sft", args, load_hardware("cpu"), "cpu", dims, pinned=pinned, budget_gb=ns.budget_gb).chosen
    if choice is None:
        raise SystemExit(f"the planner finds nothing within {ns.budget_gb} GB; give a larger --budget-gb")
    chosen = (choice.knobs.batch, choice.knobs.checkpointing, choice.knobs.attention)
    seeds = (1, True, "sdpa")

    grid = list(itertools.product([1, 2, 4, 8], [True, False], ["sdpa", "eager"]))
    rows = {}
    with tempfile.TemporaryDirectory(prefix="mpskit-planner-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        model = build_tiny_model(work / "model", ROOT / "data", dims=shape)
        print(f"budget {ns.budget_gb} GB, model {ns.model}, SFT cutoff {CUTOFF}, rank {RANK}, effective batch 8")
        print(f"{'batch':>5} {'ckpt':>4} {'attn':5} {'estimate':>9} {'measured':>9} {'tokens/s':>9}  note")
        for batch, checkpointing, attention in grid:
            case = Case("sft", CUTOFF, batch, RANK, checkpointing, attention, EFFECTIVE_BATCH // batch, ns.steps)
            row = measure(case, model, data, work / f"run-{batch}-{checkpointing}-{attention}", "cpu")
            rows[(batch, checkpointing, attention)] = row
            notes = [
                n for n, key in (("planner", chosen), ("seeds", seeds)) if key == (batch, checkpointing, attention)
            ]
            if row["measured_gb"] > ns.budget_gb:
                notes.append("over budget")
            print(
                f"{batch:>5} {'on' if checkpointing else 'off':>4} {attention:5} {row['estimate_gb']:>8.2f}G "
                f"{row['measured_gb']:>8.2f}G {row['tokens_per_second']:>9.0f}  {', '.join(notes)}",
                flush=True,
            )
    fitting = {key: row for key, row in rows.items() if row["measured_gb"] <= ns.budget_gb}
    best_key = max(fitting, key=lambda key: fitting[key]["tokens_per_second"])
    best, mine, hand = fitting[best_key], rows[chosen], rows[seeds]
    share = mine["tokens_per_second"] / best["tokens_per_second"]
    print(f"\nplanner {chosen}: {mine['tokens_per_second']:.0f} tokens/s, {mine['measured_gb']:.2f} GB")
    print(f"seeds   {seeds}: {hand['tokens_per_second']:.0f} tokens/s, {hand['measured_gb']:.2f} GB")
    print(f"best    {best_key}: {best['tokens_per_second']:.0f} tokens/s, {best['measured_gb']:.2f} GB")
    print(
        f"planner / best = {share:.1%}, planner / seeds = {mine['tokens_per_second'] / hand['tokens_per_second']:.2f}x"
    )
    print("targets: planner within the budget; at least 90% of the best")
    return 0 if mine["measured_gb"] <= ns.budget_gb and share >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
