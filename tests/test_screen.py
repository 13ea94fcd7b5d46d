"""What a user sees on a terminal: `mpskit train` through a pseudo-terminal (so tqdm and the libraries
behave as they do for a person), one mpskit line per logging step, the libraries quiet, a summary at
the end; `-v` gives the libraries' logs back. (`mpskit demo` is test_real.py's.)"""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from conftest import DURATION, ROOT, progress_line

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(__name__)]
STEP_LINE = progress_line(6)


def run_on_terminal(words: list[str], cwd: Path) -> list[str]:
    """The command's screen through a pseudo-terminal, split into lines at every newline and carriage
    return (a progress bar redrawn in place counts once per redraw)."""
    leader, follower = pty.openpty()
    # a terminal 40 rows by 160 columns: on a pty of size 0, tqdm draws nothing
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "-m", "mpskit.cli", *words],
        cwd=cwd,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(leader)
    assert child.wait(timeout=600) == 0, screen.decode(errors="replace")[-3000:]
    return [line for line in re.split(r"[\r\n]+", screen.decode(errors="replace")) if line.strip()]


def train_words(tiny_model: Path) -> list[str]:
    return ["train", f"model_name_or_path={tiny_model}", "template=qwen", "stage=sft", "dataset=demo_sft",
            f"dataset_dir={ROOT / 'data'}", "max_steps=6", "logging_steps=1", "save_steps=3",
            "include_num_input_tokens_seen=true"]  # fmt: skip


@pytest.fixture(scope="module")
def quiet_run(tiny_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("screen")
    return run_on_terminal(train_words(tiny_model), work), work


def test_one_mpskit_line_per_logging_step_and_little_else(quiet_run):
    lines, _ = quiet_run
    steps = [STEP_LINE.match(line) for line in lines if line.startswith("mpskit: step")]
    assert all(steps), [line for line in lines if line.startswith("mpskit: step")]
    assert [int(match.group(1)) for match in steps] == [1, 2, 3, 4, 5, 6]
    assert not [line for line in lines if "'loss'" in line or "it/s]" in line]  # transformers' dict, tqdm's bar
    others = [line for line in lines if not line.startswith("mpskit:")]
    assert len(others) < 15, others


def test_the_run_ends_on_a_summary_naming_the_adapter_and_next_commands(quiet_run):
    lines, work = quiet_run
    run_dir = (work / "output" / "sft-model" / "latest").resolve()
    summary = lines[lines.index(next(line for line in lines if line.startswith("mpskit: sft run finished"))) :]
    assert re.match(rf"mpskit: sft run finished in {DURATION}: step 6/6, loss \d+\.\d+ -> \d+\.\d+", summary[0])
    saved = next(line for line in summary if line.startswith("mpskit: saved: "))
    assert (work / saved.removeprefix("mpskit: saved: ")).resolve() == run_dir / "adapter_model.safetensors"
    assert any(line.startswith("mpskit: next: mpskit chat output/sft-model/") for line in summary)
    assert any("mpskit export output/sft-model/" in line for line in summary)
    # one memory figure, the same on every line that prints it and in the record
    measured = json.loads((run_dir / "mpskit.json").read_text())["memory"]["measured"]["training_gb"]
    memory_line = next(line for line in summary if line.startswith("mpskit: peak train memory"))
    assert f"peak train memory {measured:.2f} GB" in memory_line
    logged = [
        row["memory_training_gb"] for row in map(json.loads, (run_dir / "trainer_log.jsonl").open()) if "loss" in row
    ]
    assert logged == sorted(logged) and logged[-1] <= measured


def test_the_full_log_is_in_the_run_folder(quiet_run):
    _, work = quiet_run
    log = (work / "output" / "sft-model" / "latest" / "train.log").read_text()
    for kept in ("Model config Qwen2Config", "***** Running training *****", "training example:", "mpskit: step 6/6",
                 "train_loss", "mpskit: saved: "):  # fmt: skip
        assert kept in log


def test_verbose_gives_the_library_logs_back(tiny_model, tmp_path):
    lines = run_on_terminal([*train_words(tiny_model), "-v"], tmp_path)
    assert any("Model config Qwen2Config" in line for line in lines)
    assert any("'loss'" in line for line in lines)  # transformers' own log dict, under its bar
    assert len([line for line in lines if STEP_LINE.match(line)]) == 6


def test_disable_tqdm_false_keeps_transformers_bar_beside_the_mpskit_lines(tiny_model, tmp_path):
    lines = run_on_terminal([*train_words(tiny_model), "disable_tqdm=false"], tmp_path)
    assert any("it/s]" in line for line in lines) and len([line for line in lines if STEP_LINE.match(line)]) == 6
    assert not any("Model config Qwen2Config" in line or "'loss'" in line for line in lines)  # printed: in the log
    assert "{'loss'" in (tmp_path / "output" / "sft-model" / "latest" / "train.log").read_text()


def test_the_progress_line_drops_its_least_needed_figures_to_fit_the_terminal():
    from mpskit.run.progress import progress_text

    entry = {"loss": 0.6832, "learning_rate": 5e-3}
    figures = {"tokens_per_s": 12564.2, "memory_training_gb": 0.08, "memory_predicted_gb": 0.12, "eta_s": 3725}
    wide = progress_text(5, 66, entry, figures, width=200)
    assert wide == ("mpskit: step 5/66 | loss 0.6832 | lr 5.00e-03 | 12,564 tok/s | mem 0.08 GB (plan 0.12) | "
                    "ETA 1:02:05")  # fmt: skip
    assert progress_line(66).match(wide)
    at_80 = progress_text(5, 66, entry, figures, width=80)
    assert at_80 == "mpskit: step 5/66 | loss 0.6832 | mem 0.08 GB (plan 0.12) | ETA 1:02:05"
    assert progress_line(66).match(at_80)
    assert progress_text(5, 66, entry, figures, width=50) == "mpskit: step 5/66 | loss 0.6832 | ETA 1:02:05"
    assert progress_text(5, 66, entry, figures, width=10) == "mpskit: step 5/66 | loss 0.6832"  # never less


def test_an_evaluations_line_drops_beta_then_the_margin_to_fit_and_never_the_loss():
    from mpskit.run.summary import eval_text

    foodpo = {"eval_loss": 0.6793, "eval_rewards/accuracies": 1.0, "eval_rewards/margins": 0.33,
              "eval_dynamic_beta": 0.0283, "eval_rewards/chosen": 0.1}  # fmt: skip
    assert eval_text(foodpo) == "loss 0.6793 | accuracy 1.0000 | margin 0.3300 | beta 0.0283"
    head = "mpskit: step 60/60 held-out | "
    assert len(head + eval_text(foodpo, 80 - len(head))) <= 80
    assert eval_text(foodpo, 80 - len(head)) == "loss 0.6793 | accuracy 1.0000 | margin 0.3300"
    assert eval_text(foodpo, 5) == "loss 0.6793"
