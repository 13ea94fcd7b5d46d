"""The planner's choice against hand settings and against an exhaustive search, all measured here.

For one memory budget, the task (SFT, cutoff_len 256, LoRA rank 4, effective batch 8) is trained with
every setting of the planner's speed knobs (micro-batch with accumulation, checkpointing, attention),
each run in a fresh process, measuring peak memory and tokens/s. Every setting runs --repeats times,
interleaved (round after round over the whole grid, each round in a rotated order), so a busy spell
on the machine lands on all settings alike. Then it compares, by medians over the rounds:
  - the planner's choice (made from the estimate alone, before any of this ran),
  - the seeds' hand setting: batch 1, checkpointing on (cutoff 256, rank 4),
  - the fastest setting whose measured peak fits the budget,
and the ratio planner / best within each round, whose median and spread are the verdict.

    python bench/planner.py [--budget-gb 3.0] [--model mid] [--steps 3] [--repeats 3] [--lean-logits on|off]
                            [--out FILE.json]

It writes bench/results/planner.json; docs/measurements.md renders it.

Targets: the choice's measured peak within the budget; its tokens/s at least 90% of the best.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import results_file  # noqa: E402
from memory_accuracy import MODELS  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.machine.hardware import load_hardware  # noqa: E402
from mpskit.plan.memory import dims_from_mapping  # noqa: E402
from mpskit.plan.planner import PlanRequest, plan  # noqa: E402
from mpskit.tools.tiny import build_tiny_model  # noqa: E402
from mpskit.trials.measure import Case, measure, write_long_data  # noqa: E402

COLUMNS = [Column("setting", "setting"), Column("batch", "batch"), Column("checkpointing", "ckpt"),
           Column("attention", "attention"), Column("tokens/s", "tokens_s", ".0f"),
           Column("peak GB", "gb")]  # fmt: skip


def setting_row(name: str, key: tuple, speed: dict, memory: dict) -> dict:
    batch, checkpointing, attention = key
    return {"setting": name, "batch": batch, "ckpt": "on" if checkpointing else "off", "attention": attention,
            "tokens_s": speed[key], "gb": memory[key]}  # fmt: skip


def table(at: Path | None = None) -> str:
    """docs/measurements.md's table: the planner's choice, the seeds' setting and the fastest that fit."""
    results = results_file.load("planner", at)
    share, rows = results["share"], results["rows"]
    over_seeds = rows[0]["tokens_s"] / rows[1]["tokens_s"]
    return results_file.block(COLUMNS, results, f"Planner / best of its round: median {share['median']:.0%} "
                              f"[{share['min']:.0%}-{share['max']:.0%}]; {over_seeds:.2f}x the seeds' setting; "
                              f"budget {results['budget_gb']} GB.")  # fmt: skip

EFFECTIVE_BATCH, CUTOFF, RANK = 8, 256, 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-gb", type=float, default=3.0)
    parser.add_argument("--model", default="mid", choices=[m for m in MODELS if m != "tiny"])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per setting (the first is warm-up)")
    parser.add_argument("--out", default=str(results_file.path("planner")), help="the results file")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the whole grid (default 3)")
    parser.add_argument("--lean-logits", choices=["on", "off"], default="on")
    ns = parser.parse_args()
    lean = ns.lean_logits == "on"

    shape = MODELS[ns.model]
    dims = dims_from_mapping(shape)
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": EFFECTIVE_BATCH}
    args.update(cutoff_len=CUTOFF, lora_rank=RANK, lean_logits=lean)
    pinned = frozenset({"cutoff_len", "lora_rank", "bf16", "fp16", "lean_logits"})
    request = PlanRequest("sft", args, load_hardware("cpu"), "cpu", dims, pinned=pinned, budget_gb=ns.budget_gb)
    choice = plan(request).chosen
    if choice is None:
        raise SystemExit(f"the planner finds nothing within {ns.budget_gb} GB; give a larger --budget-gb")
    chosen = (choice.knobs.batch, choice.knobs.checkpointing, choice.knobs.attention)
    seeds = (1, True, "sdpa")

    grid = list(itertools.product([1, 2, 4, 8], [True, False], ["sdpa", "eager"]))
    runs: dict[tuple, list[dict]] = {key: [] for key in grid}
    with tempfile.TemporaryDirectory(prefix="mpskit-planner-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        model = build_tiny_model(work / "model", ROOT / "data", dims=shape)
        print(f"budget {ns.budget_gb} GB, model {ns.model}, SFT cutoff {CUTOFF}, rank {RANK}, effective batch 8, "
              f"lean logits {ns.lean_logits}, {ns.repeats} rounds", flush=True)  # fmt: skip
        for round_number in range(ns.repeats):
            shift = round_number * len(grid) // max(ns.repeats, 1)
            for batch, checkpointing, attention in grid[shift:] + grid[:shift]:
                case = Case("sft", CUTOFF, batch, RANK, checkpointing, attention, EFFECTIVE_BATCH // batch, ns.steps,
                            lean_logits=lean)  # fmt: skip
                out = work / f"run-{round_number}-{batch}-{checkpointing}-{attention}"
                runs[(batch, checkpointing, attention)].append(measure(case, model, data, out, "cpu"))
    print(
        f"{'batch':>5} {'ckpt':>4} {'attn':5} {'estimate':>9} {'measured':>9} {'tokens/s median [min-max]':>27}  note"
    )
    speed = {key: statistics.median(r["tokens_per_second"] for r in rows) for key, rows in runs.items()}
    memory = {key: max(r["measured_gb"] for r in rows) for key, rows in runs.items()}
    for key, rows in runs.items():
        batch, checkpointing, attention = key
        notes = [n for n, setting in (("planner", chosen), ("seeds", seeds)) if setting == key]
        if memory[key] > ns.budget_gb:
            notes.append("over budget")
        values = [r["tokens_per_second"] for r in rows]
        print(
            f"{batch:>5} {'on' if checkpointing else 'off':>4} {attention:5} {rows[0]['estimate_gb']:>8.2f}G "
            f"{memory[key]:>8.2f}G {speed[key]:>9.0f} [{min(values):.0f}-{max(values):.0f}]{'':>8}  {', '.join(notes)}"
        )
    fitting = [key for key in grid if memory[key] <= ns.budget_gb]
    best_key = max(fitting, key=speed.get)
    # within each round, the planner's choice against that round's fastest fitting setting
    per_round = [runs[chosen][i]["tokens_per_second"] / max(runs[key][i]["tokens_per_second"] for key in fitting)
                 for i in range(ns.repeats)]  # fmt: skip
    share = statistics.median(per_round)
    print(f"\nplanner {chosen}: {speed[chosen]:.0f} tokens/s, {memory[chosen]:.2f} GB")
    print(f"seeds   {seeds}: {speed[seeds]:.0f} tokens/s, {memory[seeds]:.2f} GB")
    print(f"best    {best_key}: {speed[best_key]:.0f} tokens/s, {memory[best_key]:.2f} GB")
    print(
        f"planner / best of its round: median {share:.1%} [{min(per_round):.1%}-{max(per_round):.1%}], "
        f"planner / seeds = {speed[chosen] / speed[seeds]:.2f}x"
    )
    print("targets: planner within the budget; at least 90% of the best")
    rows = [setting_row(name, key, speed, memory) for name, key in
            (("the planner's choice", chosen), ("the seeds' hand setting", seeds), ("the fastest that fit", best_key))]
    results_file.save(rows, Path(ns.out), share=results_file.spread(per_round), budget_gb=ns.budget_gb)
    return 0 if memory[chosen] <= ns.budget_gb and share >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
