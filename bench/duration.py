"""How long a run takes: `mpskit plan --probe`'s prediction and the profile figures' against measured runs.

For each setting (SFT and DPO, batch and checkpointing varied, on random-weight Qwen2-architecture
models up to Qwen2.5-0.5B's dimensions, examples long enough to fill cutoff_len), one round runs
  - `mpskit plan --probe --json` in a fresh process: one warm-up step and three timed ones, then
    the whole run extrapolated (and the figures' prediction, from the hardware profile),
  - the whole run with `mpskit train` in a fresh process: its training steps' time from mpskit.json,
probe and run in turn (A B, then B A in the next round), so a busy spell on the machine lands on both.
Errors are (predicted - measured) / measured, on the training steps' time (what grows with a run) and
on the wall-clock time of the whole process (with loading the model and saving the adapter, the
probe's own start-up taken as the run's); the table shows medians over the rounds and the spread.

    python bench/duration.py [--repeats 2] [--quick] [--hardware cpu] [--out FILE.json]

A whole run writes bench/results/duration.json; docs/measurements.md renders it.

Target: the probe within 25% of the measured run in every setting (training time, medians).
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
from memory_accuracy import MODELS  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.rundir.folder import RunDir  # noqa: E402
from mpskit.tools.tiny import build_tiny_model  # noqa: E402
from mpskit.trials.measure import OFFLINE, Case, case_words, fresh_process_env, measure, write_long_data  # noqa: E402

# (model, Case(stage, cutoff_len, batch, lora_rank, checkpointing, steps=...)); the last is the case
SETTINGS = [
    ("tiny", Case("sft", 256, 1, 8, False, steps=20)),
    ("tiny", Case("sft", 256, 4, 8, True, steps=20)),
    ("tiny", Case("dpo", 256, 2, 8, False, steps=20)),
    ("tiny", Case("dpo", 256, 1, 8, True, steps=20)),
    ("mid", Case("sft", 256, 2, 8, True, steps=10)),
    ("mid", Case("dpo", 256, 1, 8, False, steps=10)),
    ("qwen2.5-0.5b", Case("sft", 256, 1, 8, False, steps=20)),
]
TARGET = 0.25


def probe(words: list[str]) -> dict:
    """`mpskit plan --probe --json` in a fresh process: its duration and probe figures."""
    env = fresh_process_env(OFFLINE)
    done = subprocess.run([sys.executable, "-m", "mpskit.cli", "plan", "--probe", "--json", *words],
                          capture_output=True, text=True, env=env)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the probe failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(done.stdout)


def errors(predicted: list[float], measured: list[float]) -> list[float]:
    return [(p - m) / m for p, m in zip(predicted, measured, strict=True)]


COLUMNS = [Column("model", "model"), Column("stage", "stage"), Column("batch", "batch"), Column("ckpt", "ckpt"),
           Column("steps", "steps"), Column("measured s", "measured", ".1f"), Column("probe s", "probe", ".1f"),
           Column("probe error [spread]", "probe_error", "+.1%"), Column("figures s", "figures", ".1f"),
           Column("figures error", "figures_error", "+.1%"), Column("wall measured s", "wall", ".1f"),
           Column("wall probe s", "probe_wall", ".1f"), Column("wall error", "wall_error", "+.1%")]  # fmt: skip


def setting_row(model: str, case: Case, timed: dict[str, list[float]]) -> dict:
    """One setting's medians over the rounds; the probe's error with its rounds' range."""
    return {"model": model, "stage": case.stage, "batch": case.batch, "ckpt": "on" if case.checkpointing else "off",
            "steps": case.steps, **{key: statistics.median(values) for key, values in timed.items()},
            "probe_error": results_file.spread(errors(timed["probe"], timed["measured"])),
            "figures_error": statistics.median(errors(timed["figures"], timed["measured"])),
            "wall_error": statistics.median(errors(timed["probe_wall"], timed["wall"]))}  # fmt: skip


def worst_errors(rows: list[dict]) -> dict[str, float]:
    """The largest median error of the probe (training time, wall time) and of the profile's figures."""
    return {key: max(abs(row[key]["median"] if key == "probe_error" else row[key]) for row in rows)
            for key in ("probe_error", "wall_error", "figures_error")}  # fmt: skip


def summary(results: dict) -> str:
    worst = worst_errors(results["rows"])
    return (f"Worst median error: the probe {worst['probe_error']:.1%} on training time (target {TARGET:.0%}), "
            f"{worst['wall_error']:.1%} on wall time; the profile's figures {worst['figures_error']:.1%}.")  # fmt: skip


def table(at: Path | None = None) -> str:
    """docs/measurements.md's table."""
    results = results_file.load("duration", at)
    return results_file.block(COLUMNS, results, summary(results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="rounds over every setting (default 2)")
    parser.add_argument("--quick", action="store_true", help="only the tiny model's settings")
    parser.add_argument("--hardware", default="cpu", help="hardware profile whose figures are compared (default cpu)")
    parser.add_argument("--out", help="the results file (default: bench/results/duration.json, not with --quick)")
    ns = parser.parse_args()
    settings = [(m, c) for m, c in SETTINGS if m == "tiny"] if ns.quick else SETTINGS

    with tempfile.TemporaryDirectory(prefix="mpskit-duration-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        models = {m: build_tiny_model(work / m, dims=MODELS[m] or None) for m in sorted({m for m, _ in settings})}
        rows = {
            i: {key: [] for key in ("probe", "figures", "measured", "probe_wall", "wall")} for i in range(len(settings))
        }
        for round_ in range(ns.repeats):
            for i, (model, case) in enumerate(settings):
                words = case_words(case, models[model], data, ns.hardware)
                out = work / f"run-{round_}-{i}"
                for task in ("probe", "run") if round_ % 2 == 0 else ("run", "probe"):
                    if task == "probe":
                        timed = probe(words)["probe"]
                        rows[i]["probe"].append(timed["predicted_s"])
                        rows[i]["probe_wall"].append(timed["predicted_s"] + timed["startup_s"])
                    else:
                        rows[i]["wall"].append(measure(case, models[model], data, out, ns.hardware)["seconds"])
                        duration = RunDir.open(out).record.duration
                        rows[i]["measured"].append(duration.measured_s)
                        rows[i]["figures"].append(duration.predicted_s)
                print(f"round {round_ + 1}: {model} {case.stage} batch {case.batch} done", file=sys.stderr, flush=True)

    results = [setting_row(model, case, rows[i]) for i, (model, case) in enumerate(settings)]
    print(results_file.render(COLUMNS, results))
    print(summary({"rows": results}))
    out = ns.out or (None if ns.quick else results_file.path("duration"))
    if out:
        results_file.save(results, Path(out))
    return 0 if worst_errors(results)["probe_error"] <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
