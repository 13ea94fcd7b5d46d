"""Step time of fooDPO against LLaMA-Factory's DPO, in one process, on the same batches.

    python bench/foodpo_overhead.py [--model output/tiny-model] [--steps 30] [--batch 4] [--cutoff 256]
                                    [--out FILE.json]

Both trainers share one set of LoRA weights; steps alternate DPO / fooDPO so drift in machine speed
hits both alike. Prints the median step times and their ratio (target: at most 1.03), and writes them
to bench/results/foodpo-overhead.json; docs/measurements.md renders it.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import results_file  # noqa: E402
from results_file import Column  # noqa: E402

COLUMNS = [Column("loss", "loss"), Column("median step ms", "ms", ".1f")]
TARGET = 1.03


def summary(results: dict) -> str:
    dpo, foo = (row["ms"]["median"] for row in results["rows"])
    return (f"fooDPO / DPO: {foo / dpo:.3f} (target {TARGET}) over {results['steps']} steps each, batch "
            f"{results['batch']} pairs, cutoff {results['cutoff']}.")  # fmt: skip


def table(at: Path | None = None) -> str:
    """docs/measurements.md's lines."""
    results = results_file.load("foodpo-overhead", at)
    return results_file.block(COLUMNS, results, summary(results))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(ROOT / "output" / "tiny-model"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--cutoff", type=int, default=256)
    parser.add_argument("--out", default=str(results_file.path("foodpo-overhead")), help="the results file")
    opts = parser.parse_args()
    if not (Path(opts.model) / "config.json").is_file():
        print(f"no model at {opts.model}; build one with `mpskit tiny-model {opts.model}`", file=sys.stderr)
        return 2

    from mpskit.engine.trainer_builders import build_dpo_trainer
    from mpskit.settings.foodpo import FooDPOConfig

    args = {
        "model_name_or_path": opts.model, "template": "qwen", "stage": "dpo", "do_train": True,
        "finetuning_type": "lora", "lora_target": "all", "lora_rank": 8, "pref_beta": 0.1,
        "dataset_dir": str(ROOT / "data"), "dataset": "demo_pref", "cutoff_len": opts.cutoff,
        "per_device_train_batch_size": opts.batch, "output_dir": tempfile.mkdtemp(), "report_to": "none",
        "use_cpu": True, "seed": 0,
    }  # fmt: skip
    foo = build_dpo_trainer(args, FooDPOConfig(pref_beta_scale=0.05))
    dpo = build_dpo_trainer(args)
    dpo.model = foo.model
    batches = list(itertools.islice(foo.get_train_dataloader(), opts.steps))
    times: dict[str, list[float]] = {"dpo": [], "foodpo": []}
    for i, batch in enumerate(batches * 2):
        for name in ("dpo", "foodpo") if i % 2 else ("foodpo", "dpo"):
            trainer = dpo if name == "dpo" else foo
            start = time.perf_counter()
            loss, _ = trainer.get_batch_loss_metrics(trainer.model, dict(batch))
            loss.backward()
            trainer.model.zero_grad()
            if i >= 2:  # the first steps warm caches up
                times[name].append(time.perf_counter() - start)
    rows = [{"loss": label, "ms": results_file.spread([t * 1000 for t in times[name]])}
            for name, label in (("dpo", "LLaMA-Factory's DPO"), ("foodpo", "fooDPO"))]  # fmt: skip
    figures = {"steps": len(times["dpo"]), "batch": opts.batch, "cutoff": opts.cutoff}
    print(results_file.render(COLUMNS, rows))
    print(summary({"rows": rows, **figures}))
    results_file.save(rows, Path(opts.out), **figures)
    dpo, foo = (row["ms"]["median"] for row in rows)
    return 0 if foo / dpo <= TARGET else 1

if __name__ == "__main__":
    sys.exit(main())
