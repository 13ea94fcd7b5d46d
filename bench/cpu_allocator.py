"""What glibc's heap adds to training memory on a Linux CPU, and what holding it back costs in time.

glibc serves buffers under its mmap threshold (128 KiB at start, raised up to 32 MiB as large buffers
are freed) from a heap it rarely returns to the system, so a run's peak RSS holds, beside its live
tensors, the holes that freed activations and gradients leave there; how much depends on the order
of frees and moves between identical runs. With the threshold pinned low (`MALLOC_MMAP_THRESHOLD_`,
read by glibc at process start) every buffer above it is mapped and unmapped on its own: RSS follows
the live tensors. Each case, fresh processes in turn (default, pinned, then pinned, default), on
random-initialised models with Qwen's vocabulary, lean logits on; ratios pinned / default per pair.

    python bench/cpu_allocator.py [--repeats 2] [--threshold 1048576] [--out FILE.json]

It writes bench/results/cpu-allocator.json; docs/measurements.md renders it.

No target: the figures say what `MALLOC_MMAP_THRESHOLD_` is worth on a Linux machine short of memory,
and how much of `bench/memory_accuracy.py`'s CPU error is the allocator's rather than the model's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import results_file  # noqa: E402
from memory_accuracy import build_models  # noqa: E402
from results_file import Column, spread  # noqa: E402

from mpskit.trials.measure import Case, measure, write_long_data  # noqa: E402

# The lean cases of bench/memory_accuracy.py with the mid-size model: checkpointing on and off.
CASES = [
    ("mid", Case("dpo", 1024, 2, 8, True, lean_logits=True)),
    ("mid", Case("dpo", 1024, 1, 8, False, lean_logits=True)),
    ("mid", Case("sft", 2048, 1, 8, True, lean_logits=True)),
]
COLUMNS = [Column("stage", "stage"), Column("cutoff", "cutoff"), Column("batch", "batch"), Column("ckpt", "ckpt"),
           Column("estimate GB", "estimate_gb"), Column("default GB", "default_gb"),
           Column("pinned GB", "pinned_gb"), Column("memory ratio", "memory_ratio"),
           Column("time ratio", "time_ratio")]  # fmt: skip


def case_row(case: Case, default: list[dict], pinned: list[dict]) -> dict:
    """One case's figures: training memory with and without the pinned threshold, and their ratios per pair."""
    pairs = list(zip(default, pinned, strict=True))
    return {"stage": case.stage, "cutoff": case.cutoff_len, "ckpt": "on" if case.checkpointing else "off",
            "batch": case.batch if case.stage == "sft" else f"{case.batch} pair{'s' * (case.batch > 1)}",
            "estimate_gb": default[0]["estimate_gb"],
            "default_gb": spread([r["measured_gb"] for r in default]),
            "pinned_gb": spread([r["measured_gb"] for r in pinned]),
            "memory_ratio": spread([p["measured_gb"] / d["measured_gb"] for d, p in pairs]),
            "time_ratio": spread([d["tokens_per_second"] / p["tokens_per_second"] for d, p in pairs])}  # fmt: skip


def table(at: Path | None = None) -> str:
    """docs/measurements.md's table."""
    results = results_file.load("cpu-allocator", at)
    memory = [row["memory_ratio"]["median"] for row in results["rows"]]
    time = [row["time_ratio"]["median"] for row in results["rows"]]
    return results_file.block(COLUMNS, results, f"Pinned, the runs hold {1 - max(memory):.0%} to {1 - min(memory):.0%} "
                              f"less training memory, at steps {min(time) - 1:.0%} to {max(time) - 1:.0%} slower "
                              "(the medians).")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs per case (default 2)")
    parser.add_argument("--threshold", type=int, default=1024**2, help="pinned mmap threshold in bytes")
    parser.add_argument("--out", default=str(results_file.path("cpu-allocator")), help="the results file")
    ns = parser.parse_args()
    if ns.repeats < 1:
        parser.error("--repeats must be 1 or more")
    pinned_env = {"MALLOC_MMAP_THRESHOLD_": str(ns.threshold)}
    with tempfile.TemporaryDirectory(prefix="mpskit-allocator-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        models = build_models({model for model, _ in CASES}, work / "models")
        rows = []
        for i, (model, case) in enumerate(CASES):
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for repeat in range(ns.repeats):
                for pinned in (False, True) if repeat % 2 == 0 else (True, False):
                    out = work / f"run-{i}-{repeat}-{'pinned' if pinned else 'default'}"
                    runs[pinned].append(measure(case, models[model], data, out, "cpu", pinned_env if pinned else None))
            rows.append(case_row(case, runs[False], runs[True]))
            print(results_file.render(COLUMNS, rows), flush=True)
    results_file.save(rows, Path(ns.out))
    print("GB: training memory (peak RSS minus the RSS after the imports)")
    print(f"pinned: MALLOC_MMAP_THRESHOLD_={ns.threshold}")
    print("ratios pinned / default: memory, and step time (tokens/s default over pinned)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
