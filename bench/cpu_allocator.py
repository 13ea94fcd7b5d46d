"""What glibc's heap adds to training memory on a Linux CPU, and what holding it back costs in time.

glibc serves buffers under its mmap threshold (128 KiB at start, raised up to 32 MiB as large buffers
are freed) from a heap it rarely returns to the system, so a run's peak RSS holds, beside its live
tensors, the holes that freed activations and gradients leave there; how much depends on the order
of frees and moves between identical runs. With the threshold pinned low (`MALLOC_MMAP_THRESHOLD_`,
read by glibc at process start) every buffer above it is mapped and unmapped on its own: RSS follows
the live tensors. Each case, fresh processes in turn (default, pinned, then pinned, default), on
random-initialised models with Qwen's vocabulary, lean logits on; ratios pinned / default per pair.

    python bench/cpu_allocator.py [--repeats 2] [--threshold 1048576]

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

from lean_logits import spread  # noqa: E402
from memory_accuracy import build_models  # noqa: E402

from mpskit.trials.measure import Case, measure, write_long_data  # noqa: E402

# The lean cases of bench/memory_accuracy.py with the mid-size model: checkpointing on and off.
CASES = [
    ("mid", Case("dpo", 1024, 2, 8, True, lean_logits=True)),
    ("mid", Case("dpo", 1024, 1, 8, False, lean_logits=True)),
    ("mid", Case("sft", 2048, 1, 8, True, lean_logits=True)),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs per case (default 2)")
    parser.add_argument("--threshold", type=int, default=1024**2, help="pinned mmap threshold in bytes")
    ns = parser.parse_args()
    if ns.repeats < 1:
        parser.error("--repeats must be 1 or more")
    pinned_env = {"MALLOC_MMAP_THRESHOLD_": str(ns.threshold)}
    with tempfile.TemporaryDirectory(prefix="mpskit-allocator-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        models = build_models({model for model, _ in CASES}, work / "models")
        print(f"{'stage':6} {'cutoff':>6} {'batch':>5} {'ckpt':>4} {'estimate':>8} {'default GB':>18} "
              f"{'pinned GB':>18} {'memory ratio':>18} {'time ratio':>18}", flush=True)  # fmt: skip
        for i, (model, case) in enumerate(CASES):
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for repeat in range(ns.repeats):
                for pinned in (False, True) if repeat % 2 == 0 else (True, False):
                    out = work / f"run-{i}-{repeat}-{'pinned' if pinned else 'default'}"
                    runs[pinned].append(measure(case, models[model], data, out, "cpu", pinned_env if pinned else None))
            default, pinned = runs[False], runs[True]
            memory = [p["measured_gb"] / d["measured_gb"] for d, p in zip(default, pinned, strict=True)]
            time = [d["tokens_per_second"] / p["tokens_per_second"] for d, p in zip(default, pinned, strict=True)]
            print(f"{case.stage:6} {case.cutoff_len:>6} {case.batch:>5} {'on' if case.checkpointing else 'off':>4} "
                  f"{default[0]['estimate_gb']:>8.2f} {spread([r['measured_gb'] for r in default]):>18} "
                  f"{spread([r['measured_gb'] for r in pinned]):>18} {spread(memory):>18} {spread(time):>18}",
                  flush=True)  # fmt: skip
    print("GB: training memory (peak RSS minus the RSS after the imports)")
    print(f"pinned: MALLOC_MMAP_THRESHOLD_={ns.threshold}")
    print("ratios pinned / default: memory, and step time (tokens/s default over pinned)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
