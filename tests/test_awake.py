"""On macOS, `mpskit train` keeps the machine awake with caffeinate for exactly the life of the run."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

# mpskit's command line in a process that takes itself for macOS (the rest of the machine is as it is)
AS_MACOS = "import sys, mpskit.run.awake as a; a.on_macos = lambda: True; from mpskit.cli import main; sys.exit(main())"
FAKE_CAFFEINATE = """#!/bin/sh
echo "started $*" >> "$CAFFEINATE_LOG"
trap 'echo stopped >> "$CAFFEINATE_LOG"; exit 0' TERM
while :; do sleep 0.05; done
"""


def train_as_macos(tmp_path, tiny_model, *words: str) -> tuple[subprocess.Popen, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "caffeinate").write_text(FAKE_CAFFEINATE)
    (bin_dir / "caffeinate").chmod(0o755)
    log = tmp_path / "caffeinate.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CAFFEINATE_LOG": str(log)}
    command = [sys.executable, "-c", AS_MACOS, "train", "preset=sft", "model_preset=tiny",
               f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "max_steps=2",
               "eval_strategy=no", "--hardware", "cpu", *words]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err.decode()[-2000:]
    return process, log.read_text().splitlines() if log.exists() else []


@pytest.mark.e2e
def test_caffeinate_holds_the_mac_awake_while_the_run_trains(tmp_path, tiny_model):
    process, log = train_as_macos(tmp_path, tiny_model)
    assert log == [f"started -i -w {process.pid}", "stopped"]  # idle sleep, tied to mpskit's own process
    record = json.loads(next((tmp_path / "output").glob("*/*/mpskit.json")).read_text())
    assert record["keep_awake"] is True and record["attempts"][-1]["outcome"] == "finished"
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "bin" / "caffeinate")], capture_output=True)
    assert leftover.returncode == 1  # no caffeinate left running


@pytest.mark.e2e
@pytest.mark.slow  # the switch's other setting: make test trains with caffeinate held
def test_keep_awake_false_starts_no_caffeinate(tmp_path, tiny_model):
    _, log = train_as_macos(tmp_path, tiny_model, "keep_awake=false")
    assert log == []


def test_keep_awake_must_be_a_switch():
    from mpskit.errors import MpskitError
    from mpskit.settings.resolve import resolve

    with pytest.raises(MpskitError, match="keep_awake='sometimes' is not true or false"):
        resolve({"stage": "sft", "model_preset": "tiny", "keep_awake": "sometimes"}, hardware="cpu")
