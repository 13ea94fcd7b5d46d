"""How long `mpskit demo` takes on this machine, and what the plan gives its training on three Macs.

Each round runs `mpskit demo` as `make demo` does, in a fresh working folder, nothing else running
(the real model must be fetched: `make install`). The demo's own table gives each stage's wall time;
the whole is timed from outside. The README shows the medians and range over the rounds
(scripts/docs_tables.py), and beside them what the planner gives the three stages' training steps
on the Mac profiles: unmeasured figures, computed when the README is rendered.

    python bench/demo_time.py [--repeats 3] [--out FILE.json]

It writes bench/results/demo-time.json.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import results_file  # noqa: E402

from mpskit.self_command import mpskit_command  # noqa: E402
from mpskit.tools.demo import STAGE_WORDS, stage_words  # noqa: E402

STAGE_LINE = re.compile(rf"^({'|'.join(STAGE_WORDS)})\s.*\s(\d+) s$")  # a row of the demo's table
MAC_PROFILES = ("m1-8gb", "m1-pro-16gb", "m3-max-64gb")
STAGE_NAMES = {"sft": "SFT", "dpo": "DPO", "foodpo": "fooDPO"}


def one_demo(work: Path) -> dict[str, float]:
    """One `mpskit demo` in WORK: the whole wall time and each stage's, from its table."""
    started = time.perf_counter()
    done = subprocess.run([*mpskit_command(), "demo"], cwd=work, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mpskit demo failed: {done.stderr.strip()[-500:]}")
    seconds = {"the whole demo": time.perf_counter() - started}
    for line in done.stdout.splitlines():
        if found := STAGE_LINE.match(line):
            seconds[found[1]] = float(found[2])
    return seconds


def planned_training_s(hardware: str) -> float:
    """What the plan gives the demo's three stages' training steps on HARDWARE."""
    from mpskit.plan.advice import plan_duration, planned
    from mpskit.settings.resolve import resolve
    from mpskit.settings.run_words import read_run_words

    total = 0.0
    for stage in STAGE_WORDS:
        given = read_run_words([*stage_words(stage), f"hardware={hardware}"])
        run, plan = planned(resolve(given.values, hardware=given.hardware))
        total += plan_duration(run, plan).total_s
    return total


def summary(at: Path | None = None) -> str:
    """The README's lines: the demo's time here, and the plan's on the Macs."""
    results = results_file.load("demo-time", at)
    rows = {row["part"]: row["seconds"] for row in results["rows"]}
    whole = rows.pop("the whole demo")
    stages = ", ".join(f"{STAGE_NAMES[stage]} {s['median']:.0f} s" for stage, s in rows.items())
    macs = ", ".join(f"{planned_training_s(name):.0f} s on `{name}`" for name in MAC_PROFILES)
    return (f"The demo takes {whole['median']:.0f} s ({whole['min']:.0f}-{whole['max']:.0f}) here once installed: "
            f"{stages}, the chats and the GGUF step the rest. On the Mac profiles the plan gives the three "
            f"stages' training steps {macs}. Those are unmeasured figures; starting, loading and evaluating "
            f"come on top.\n\n{results_file.source_line(results)}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--out", default=str(results_file.path("demo-time")), help="the results file")
    ns = parser.parse_args()
    rounds = []
    for repeat in range(ns.repeats):
        with tempfile.TemporaryDirectory(prefix="mpskit-demo-time-") as tmp:
            rounds.append(one_demo(Path(tmp)))
        print(f"round {repeat + 1}: " + ", ".join(f"{part} {s:.0f} s" for part, s in rounds[-1].items()), flush=True)
    rows = [{"part": part, "seconds": results_file.spread([r[part] for r in rounds])} for part in rounds[0]]
    results_file.save(rows, Path(ns.out))
    print(summary(Path(ns.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
