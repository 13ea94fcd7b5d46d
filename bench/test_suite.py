"""Where `make test`'s time goes: per test file, its tests' time, and inside the Python processes
they start, the time spent importing the libraries (torch, transformers, peft, trl, datasets,
accelerate, LLaMA-Factory), loading the model (from_pretrained), training (Trainer.train) and the
rest (mpskit's checks, data, saving, plots). The test process's own share is the tests' time less
their processes' (assertions, fixtures, waiting). Then, per test file, the trainer classes whose
train() ran in the processes its tests started.

    .venv/bin/python bench/test_suite.py [pytest arguments, e.g. tests/test_e2e.py -n 0]

Each process's figures come from bench/suite_timing/sitecustomize.py, put on PYTHONPATH for the run.
A process forked from one that imported the libraries already (the tests' warm runner) counts no
import; the forkserver that imports them once is counted as a process of its own.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("import_s", "load_s", "train_s")


def test_times(junit: Path) -> dict[str, float]:
    """Test id -> its time (setup, call and teardown) as pytest's JUnit XML reports it."""
    times = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        times[f"{path}::{case.get('name')}"] = float(case.get("time", 0))
    return times


def process_figures(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in folder.glob("*.json")]


def breakdown(times: dict[str, float], processes: list[dict]) -> list[dict]:
    """One row per test file: tests, their time, and their processes' phases (seconds)."""
    rows = collections.defaultdict(lambda: collections.Counter())
    for test, seconds in times.items():
        rows[test.split("::")[0]].update(tests=1, test_s=seconds)
    for process in processes:
        test = process["test"].split(" ")[0]
        if not test:  # the test process itself
            continue
        child = rows[test.split("::")[0]]
        child.update(processes=1, process_s=process["wall_s"], **{phase: process[phase] for phase in PHASES})
    table = []
    for name, row in rows.items():
        other = row["process_s"] - sum(row[phase] for phase in PHASES)
        table.append({"file": name, "tests": row["tests"], "test_s": row["test_s"], "processes": row["processes"],
                      **{phase: row[phase] for phase in PHASES}, "process_other_s": max(other, 0.0),
                      "test_process_s": max(row["test_s"] - row["process_s"], 0.0)})  # fmt: skip
    return sorted(table, key=lambda row: -row["test_s"])


def trainers_by_file(processes: list[dict]) -> dict[str, collections.Counter]:
    """Test file -> the trainer classes whose train() ran in the processes its tests started, counted."""
    trained = collections.defaultdict(collections.Counter)
    for process in processes:
        if process["test"] and process.get("trainers"):
            trained[process["test"].split("::")[0]].update(process["trainers"])
    return dict(sorted(trained.items()))


def print_trainers(trained: dict[str, collections.Counter]) -> None:
    print("\ntest files whose runs trained, with the trainer classes that ran (times):")
    for name, classes in trained.items():
        print(f"  {name}: " + ", ".join(f"{cls} ({count})" for cls, count in sorted(classes.items())))


def print_table(table: list[dict], wall_s: float, exit_code: int) -> None:
    columns = ["tests", "test_s", "processes", *PHASES, "process_other_s", "test_process_s"]
    print(f"{'file':38}" + "".join(f"{column:>16}" for column in columns))
    for row in table:
        print(f"{row['file']:38}" + "".join(f"{row[column]:16.0f}" for column in columns))
    total = {column: sum(row[column] for row in table) for column in columns}
    print(f"{'total':38}" + "".join(f"{total[column]:16.0f}" for column in columns))
    print(f"\npytest wall time {wall_s:.0f} s, exit code {exit_code}; test_s sums the tests' own times "
          "(several workers overlap them)")  # fmt: skip


def main(pytest_args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="suite-timing-") as folder:
        figures, junit = Path(folder, "processes"), Path(folder, "junit.xml")
        figures.mkdir()
        hook = str(ROOT / "bench" / "suite_timing")
        env = {**os.environ, "SUITE_TIMING_DIR": str(figures),
               "PYTHONPATH": os.pathsep.join(filter(None, [hook, os.environ.get("PYTHONPATH")]))}  # fmt: skip
        began = time.time()
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={junit}", *pytest_args],
                              cwd=ROOT, env=env).returncode  # fmt: skip
        processes = process_figures(figures)
        print_table(breakdown(test_times(junit), processes), time.time() - began, code)
        print_trainers(trainers_by_file(processes))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
