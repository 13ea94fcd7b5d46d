"""How fast mpskit answers before any training: `--help`, `plan`, `config`, and `train` with a typo
(answered by the key check, before torch or LLaMA-Factory is imported).

Each command runs in a fresh process, the commands interleaved round by round (A B C D, A B C D, ...),
so a busy spell on the machine lands on all of them; the table shows medians and the spread.

    python bench/answer_speed.py [--repeats 5] [--out FILE.json]

It writes bench/results/answer-speed.json; docs/measurements.md renders it.

Targets: the typo answered in under 1 s, and `config` within 1.5x of `plan`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import results_file  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.tools.tiny import build_tiny_model  # noqa: E402
from mpskit.trials.measure import OFFLINE, fresh_process_env  # noqa: E402


def commands(model: Path) -> dict[str, tuple[list[str], int]]:
    """Each command's words and the exit code it should end with."""
    base = ["stage=dpo", f"model_name_or_path={model}", "template=qwen", f"dataset_dir={ROOT / 'mpskit' / 'data'}",
            "preset=dpo"]  # fmt: skip
    return {
        "--help": (["--help"], 0),
        "plan": (["plan", *base], 0),
        "config": (["config", *base], 0),
        "train, a typo": (["train", *base, "learning_rat=1e-4"], 2),
    }


COLUMNS = [Column("command", "command"), Column("seconds", "seconds")]
TYPO = "train, a typo"


def verdict(rows: list[dict]) -> tuple[float, float]:
    """The typo's answer time and config's time over plan's, from the medians."""
    median = {row["command"]: row["seconds"]["median"] for row in rows}
    return median[f"`{TYPO}`"], median["`config`"] / median["`plan`"]


def table(at: Path | None = None) -> str:
    """docs/measurements.md's table."""
    results = results_file.load("answer-speed", at)
    typo, ratio = verdict(results["rows"])
    return results_file.block(COLUMNS, results, f"A typo answered in {typo:.2f} s (target 1 s). `config` takes "
                              f"{ratio:.2f}x `plan` (target 1.5x).")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="rounds over every command (default 5)")
    parser.add_argument("--out", default=str(results_file.path("answer-speed")), help="the results file")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mpskit-answer-speed-") as tmp:
        work = Path(tmp)
        todo = commands(build_tiny_model(work / "tiny"))
        seconds: dict[str, list[float]] = {name: [] for name in todo}
        for _ in range(ns.repeats):
            for name, (words, expected) in todo.items():
                started = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "mpskit.cli", *words], capture_output=True, text=True,
                                      cwd=work, env=fresh_process_env(OFFLINE))  # fmt: skip
                seconds[name].append(time.perf_counter() - started)
                if done.returncode != expected:
                    raise SystemExit(f"{name} ended {done.returncode}, not {expected}: {done.stderr.strip()[-300:]}")
    rows = [{"command": f"`{name}`", "seconds": results_file.spread(values)} for name, values in seconds.items()]
    print(results_file.render(COLUMNS, rows))
    typo, ratio = verdict(rows)
    print(f"{ns.repeats} rounds, interleaved: a typo answered in {typo:.2f} s (target 1 s); config {ratio:.2f}x plan "
          "(target 1.5x)")
    results_file.save(rows, Path(ns.out))
    return 0 if typo < 1 and ratio <= 1.5 else 1

if __name__ == "__main__":
    raise SystemExit(main())
