"""The plan's duration for the demo data (short rows) at cutoff_len 512 and 4096: before (every row
at cutoff_len, as when no tokenizer counts the rows) and after (the rows' own token lengths), against
`mpskit plan --probe` and against the measured run.

For each setting (SFT and DPO on the tiny model, knobs pinned, the demo's own datasets), one round
plans it twice (`mpskit plan --json`, once with a copy of the model that has no tokenizer.json), then
runs the probe and the whole run in turn (A B, then B A in the next round). Errors are
(predicted - measured) / measured on the training steps' time; the table shows medians over the
rounds and the spread of the "after" error.

    python bench/demo_duration.py [--repeats 3] [--steps 40] [--hardware cpu] [--out FILE.json]

It writes bench/results/demo-duration.json; docs/measurements.md renders it.

Target: the plan's duration ("after") within 25% of the probe's and of the measured run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import results_file  # noqa: E402
from duration import TARGET, errors, probe  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.rundir.folder import RunDir  # noqa: E402
from mpskit.tools.tiny import build_tiny_model  # noqa: E402
from mpskit.trials.measure import OFFLINE, Case, case_words, fresh_process_env, train_in_fresh_process  # noqa: E402

DEMO = ROOT / "mpskit" / "data"
DATASETS = {"sft": "demo_sft", "dpo": "demo_pref"}
BATCH = 4
COLUMNS = [Column("stage", "stage"), Column("cutoff", "cutoff"), Column("measured s", "measured", ".1f"),
           Column("probe s", "probe", ".1f"), Column("plan before s", "before", ".1f"),
           Column("plan after s", "after", ".1f"), Column("before vs measured", "before_error", "+.0%"),
           Column("after vs measured [spread]", "after_error", "+.0%"),
           Column("after vs probe", "after_probe_error", "+.0%")]  # fmt: skip


def case_row(case: Case, timed: dict[str, list[float]]) -> dict:
    """One setting's medians over the rounds; the plan's error after the change with its rounds' range."""
    return {"stage": case.stage, "cutoff": case.cutoff_len,
            **{key: statistics.median(values) for key, values in timed.items()},
            "before_error": statistics.median(errors(timed["before"], timed["measured"])),
            "after_error": results_file.spread(errors(timed["after"], timed["measured"])),
            "after_probe_error": statistics.median(errors(timed["after"], timed["probe"]))}  # fmt: skip


def worst_error(rows: list[dict]) -> float:
    return max(max(abs(row["after_error"]["median"]), abs(row["after_probe_error"])) for row in rows)


def table(at: Path | None = None) -> str:
    """docs/measurements.md's table."""
    results = results_file.load("demo-duration", at)
    worst = worst_error(results["rows"])
    return results_file.block(COLUMNS, results, f"Worst error of the plan's duration: {worst:.0%} against the run "
                              f"and the probe (target {TARGET:.0%}).")  # fmt: skip


def demo_words(case: Case, model: Path, hardware: str) -> list[str]:
    """The case's pinned knobs on the demo's own training set."""
    words = case_words(case, model, DEMO, hardware)
    return [f"dataset={DATASETS[case.stage]}" if word.startswith("dataset=long_") else word for word in words]


def planned_s(words: list[str]) -> float:
    done = subprocess.run([sys.executable, "-m", "mpskit.cli", "plan", "--json", *words], capture_output=True,
                          text=True, env=fresh_process_env(OFFLINE))  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the plan failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(done.stdout)["duration"]["predicted_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="rounds over every setting (default 3)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps of each run (default 40)")
    parser.add_argument("--hardware", default="cpu", help="hardware profile whose figures plan (default cpu)")
    parser.add_argument("--out", default=str(results_file.path("demo-duration")), help="the results file")
    ns = parser.parse_args()
    settings = [Case(stage, cutoff, BATCH, 8, False, steps=ns.steps) for stage in DATASETS for cutoff in (512, 4096)]
    keys = ("before", "after", "probe", "measured")
    rows = {i: {key: [] for key in keys} for i in range(len(settings))}
    with tempfile.TemporaryDirectory(prefix="mpskit-demo-duration-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "tiny")
        no_tokenizer = work / "tiny-config-only"  # same dims, nothing to count tokens with
        no_tokenizer.mkdir()
        shutil.copy(model / "config.json", no_tokenizer)
        for round_ in range(ns.repeats):
            for i, case in enumerate(settings):
                words = demo_words(case, model, ns.hardware)
                rows[i]["after"].append(planned_s(words))
                rows[i]["before"].append(planned_s(demo_words(case, no_tokenizer, ns.hardware)))
                for task in ("probe", "run") if (round_ + i) % 2 == 0 else ("run", "probe"):
                    if task == "probe":
                        rows[i]["probe"].append(probe(words)["probe"]["predicted_s"])
                    else:
                        out = work / f"run-{round_}-{i}"
                        train_in_fresh_process([*words, f"output_dir={out}"], f"demo run {case}", f"see {out}", OFFLINE)
                        rows[i]["measured"].append(RunDir.open(out).record.duration.measured_s)
                print(f"round {round_ + 1}: {case.stage} cutoff {case.cutoff_len} done", file=sys.stderr, flush=True)

    results = [case_row(case, rows[i]) for i, case in enumerate(settings)]
    print(results_file.render(COLUMNS, results))
    worst = worst_error(results)
    print(f"{ns.steps} steps of batch {BATCH}, {ns.hardware} profile's figures, medians of {ns.repeats} rounds; "
          f"worst error of the plan's duration: {worst:.0%} (target {TARGET:.0%})")
    results_file.save(results, Path(ns.out))
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
