"""How fast mpskit answers before any training: `--help`, `plan`, `config`, and `train` with a typo
(answered by the key check, before torch or LLaMA-Factory is imported).

Each command runs in a fresh process, the commands interleaved round by round (A B C D, A B C D, ...),
so a busy spell on the machine lands on all of them; the table shows medians and the spread.

    python bench/answer_speed.py [--repeats 5]

Targets: the typo answered in under 1 s, and `config` within 1.5x of `plan`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="rounds over every command (default 5)")
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
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"{'command':15} {'median':>7} {'spread':>13}")
    for name, values in seconds.items():
        print(f"{name:15} {median[name]:>6.2f}s {min(values):>5.2f}..{max(values):.2f}s")
    ratio = median["config"] / median["plan"]
    print(f"{ns.repeats} rounds, interleaved: a typo answered in {median['train, a typo']:.2f} s (target 1 s); "
          f"config {ratio:.2f}x plan (target 1.5x)")
    return 0 if median["train, a typo"] < 1 and ratio <= 1.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
