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

    python bench/duration.py [--repeats 2] [--quick] [--hardware cpu]

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

from memory_accuracy import MODELS  # noqa: E402

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


def spread(values: list[float]) -> str:
    return f"{min(values):+.1%}..{max(values):+.1%}" if len(values) > 1 else ""


def errors(predicted: list[float], measured: list[float]) -> list[float]:
    return [(p - m) / m for p, m in zip(predicted, measured, strict=True)]


def report(settings: list, rows: dict, repeats: int, hardware: str) -> float:
    """Print the table; the worst median error of the probe on training time."""
    print(f"{'model':13} {'stage':5} {'batch':>5} {'ckpt':>4} {'steps':>5} | training: measured  probe   error"
          f"          spread figures   error | wall: measured  probe   error")  # fmt: skip
    worst = {"probe": 0.0, "probe_wall": 0.0, "figures": 0.0}
    for i, (model, case) in enumerate(settings):
        r = rows[i]
        probe_errors = errors(r["probe"], r["measured"])
        error = {"probe": statistics.median(probe_errors),
                 "probe_wall": statistics.median(errors(r["probe_wall"], r["wall"])),
                 "figures": statistics.median(errors(r["figures"], r["measured"]))}  # fmt: skip
        worst = {key: max(worst[key], abs(error[key])) for key in worst}
        median = {key: statistics.median(values) for key, values in r.items()}
        print(
            f"{model:13} {case.stage:5} {case.batch:>5} {'on' if case.checkpointing else 'off':>4} {case.steps:>5} | "
            f"{median['measured']:>18.1f}s {median['probe']:>6.1f}s {error['probe']:>+7.1%} "
            f"{spread(probe_errors):>15} {median['figures']:>6.1f}s {error['figures']:>+7.1%} | "
            f"{median['wall']:>13.1f}s {median['probe_wall']:>6.1f}s {error['probe_wall']:>+7.1%}"
        )
    print(f"worst error (medians over {repeats} rounds): probe {worst['probe']:.1%} on training time "
          f"(target {TARGET:.0%}), {worst['probe_wall']:.1%} on wall time; "
          f"{hardware} profile's figures {worst['figures']:.1%}")  # fmt: skip
    return worst["probe"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="rounds over every setting (default 2)")
    parser.add_argument("--quick", action="store_true", help="only the tiny model's settings")
    parser.add_argument("--hardware", default="cpu", help="hardware profile whose figures are compared (default cpu)")
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

    worst_probe = report(settings, rows, ns.repeats, ns.hardware)
    return 0 if worst_probe <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
