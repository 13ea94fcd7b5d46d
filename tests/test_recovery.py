"""Never lose a run (real training on the tiny model): an out-of-memory error falls back a rung and
resumes from the checkpoint; SIGINT saves and stops, and --resume reaches the uninterrupted end."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_mpskit
from test_e2e import losses

from mpskit.rundir.checkpoints import incomplete_reason

pytestmark = pytest.mark.e2e
RUN = ["preset=sft", "template=qwen", f"dataset_dir={ROOT / 'data'}", "cutoff_len=128", "learning_rate=5e-3"]


def log_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]


def final_state(run_dir: Path) -> tuple[int, float]:
    state = json.loads((run_dir / "trainer_state.json").read_text())
    return state["global_step"], [row["loss"] for row in state["log_history"] if "loss" in row][-1]


def test_synthetic_out_of_memory_falls_back_a_rung_and_resumes(tmp_path, tiny_model):
    result = run_mpskit(
        "train", *RUN, f"model_name_or_path={tiny_model}", "num_train_epochs=1", "save_steps=2", "logging_steps=1",
        "disable_gradient_checkpointing=false",  # checkpointing on: the ladder's first rung is the micro-batch
        cwd=tmp_path, env={"MPSKIT_FAKE_OOM_AT_STEP": "3"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "out of memory on mps in attempt 1" in result.stderr and "max allowed 12.48 GB" in result.stderr
    run_dir = (tmp_path / "output" / "sft-model" / "latest").resolve()
    first, second = json.loads((run_dir / "mpskit.json").read_text())["attempts"]
    assert first["outcome"] == "out of memory" and first["device_figures"]["allowed_gb"] == pytest.approx(12.48)
    assert second["outcome"] == "finished" and second["resumed_from"] == "checkpoint-2"
    batch, accumulation = "per_device_train_batch_size", "gradient_accumulation_steps"
    assert second["knobs"][batch] == first["knobs"][batch] // 2
    assert (
        second["knobs"][batch] * second["knobs"][accumulation] == first["knobs"][batch] * first["knobs"][accumulation]
    )
    assert second["knobs"]["disable_gradient_checkpointing"] is False
    assert "finished; out of memory changed: micro-batch" in result.stderr
    written = yaml.safe_load((run_dir / "llamafactory.yaml").read_text())  # what trains now, for a resume
    assert [written[batch], written[accumulation]] == [second["knobs"][batch], second["knobs"][accumulation]]
    assert json.loads((run_dir / "mpskit.json").read_text())["llamafactory_args"] == written
    # the rung is planned as the run was, and each attempt measured against its own setting's plan
    memory = json.loads((run_dir / "mpskit.json").read_text())["memory"]
    assert second["predicted_gb"] < first["predicted_gb"] and memory["knobs"]["batch"] == second["knobs"][batch]
    assert memory["predicted"]["training_gb"] == second["predicted_gb"]
    # The rung trains in a fresh process, its figure its own (in the failed attempt's process it read up
    # to 0.089 GB against 0.066), measured without the shared-library pages RSS counts (run/monitor.py):
    # with them a fresh clone's venv read 25-30% above this repository's .venv.
    assert "in a fresh process" in result.stderr
    measured = second["measured"]
    assert 0.85 < measured["training_gb"] / second["predicted_gb"] < 1.15, (measured, first["measured"])
    steps = [row["current_steps"] for row in log_rows(run_dir) if "loss" in row]
    assert steps[:2] == [1, 2] and steps[2] == 3 and steps.count(1) == 1  # resumed at 3, not restarted at 1
    assert (run_dir / "adapter_model.safetensors").is_file()
    assert final_state(run_dir)[0] == 33  # 264 examples / effective batch 8


def test_a_micro_batch_the_user_wrote_is_split_keeping_the_experiment(tmp_path, tiny_model):
    """The user's micro-batch, LoRA rank and cutoff_len: the ladder re-splits the same effective batch and
    resumes; the rank and the cutoff stay as written."""
    written = ["per_device_train_batch_size=8", "gradient_accumulation_steps=1", "lora_rank=8", "cutoff_len=128",
               "disable_gradient_checkpointing=false"]  # fmt: skip
    result = run_mpskit(
        "train", *RUN, f"model_name_or_path={tiny_model}", *written, "num_train_epochs=1", "save_steps=2",
        cwd=tmp_path, env={"MPSKIT_FAKE_OOM_AT_STEP": "3"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = (tmp_path / "output" / "sft-model" / "latest").resolve()
    first, second = json.loads((run_dir / "mpskit.json").read_text())["attempts"]
    assert second["resumed_from"] == "checkpoint-2" and second["outcome"] == "finished"
    assert second["knobs"]["per_device_train_batch_size"] == 4 and second["knobs"]["gradient_accumulation_steps"] == 2
    assert second["knobs"]["lora_rank"] == 8 and second["knobs"]["cutoff_len"] == 128
    assert final_state(run_dir)[0] == 33  # 264 examples / effective batch 8, as asked


def test_with_nothing_left_that_keeps_the_experiment_it_stops_with_the_command_that_fits(tmp_path, tiny_model):
    kept = ["per_device_train_batch_size=1", "gradient_accumulation_steps=8", "disable_gradient_checkpointing=false",
            "oom_ladder=keep"]  # fmt: skip
    result = run_mpskit(
        "train", *RUN, f"model_name_or_path={tiny_model}", *kept, "num_train_epochs=1", "save_steps=2",
        cwd=tmp_path, env={"MPSKIT_FAKE_OOM_AT_STEP": "3"},
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mpskit: error: out of memory and no free knob is left")
    assert "mpskit train" in last and "lora_rank=4" in last and "oom_ladder=adapt" in last


def test_sigint_then_resume_reaches_the_uninterrupted_end(tmp_path, tiny_model):
    words = [*RUN, f"model_name_or_path={tiny_model}", "num_train_epochs=2", "logging_steps=1", "save_steps=1000"]
    whole = run_mpskit("train", *words, "run_name=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    whole_step, whole_loss = final_state((tmp_path / "output" / "whole" / "latest").resolve())

    command = [sys.executable, "-m", "mpskit.cli", "train", *words, "run_name=cut"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=env)
    logs = tmp_path / "output" / "cut"
    deadline = time.time() + 300
    while time.time() < deadline and not any(
        len(p.read_text().splitlines()) >= 10 for p in logs.glob("*/trainer_log.jsonl")
    ):
        time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stderr[-3000:]
    run_dir = (logs / "latest").resolve()
    assert f"resume with: mpskit train --resume {logs.relative_to(tmp_path) / run_dir.name}" in stderr
    stopped_at, _ = final_state(run_dir)
    assert 10 <= stopped_at < whole_step and (run_dir / f"checkpoint-{stopped_at}").is_dir()
    assert not [row for row in log_rows(run_dir) if "eval_loss" in row]  # a stop saves and goes, no held-out pass

    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    step, loss = final_state(run_dir)
    assert step == whole_step
    assert loss == pytest.approx(whole_loss, rel=0.02)
    attempts = json.loads((run_dir / "mpskit.json").read_text())["attempts"]
    assert [a["outcome"] for a in attempts] == ["stopped by SIGINT", "finished"]
    assert attempts[1]["resumed_from"] == f"checkpoint-{stopped_at}"
    assert all(math.isfinite(x) for x in losses(run_dir))


def test_a_run_killed_hard_resumes_from_its_last_checkpoint(tmp_path, tiny_model):
    words = [*RUN, f"model_name_or_path={tiny_model}", "num_train_epochs=1", "logging_steps=1", "save_steps=4"]
    command = [sys.executable, "-m", "mpskit.cli", "train", *words]
    child = subprocess.Popen(
        command, cwd=tmp_path, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    runs = tmp_path / "output" / "sft-model"
    deadline = time.time() + 300
    while time.time() < deadline and not list(runs.glob("*/checkpoint-8")):
        time.sleep(0.2)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    run_dir = (runs / "latest").resolve()
    saved = sorted(int(p.name.split("-")[1]) for p in run_dir.glob("checkpoint-*"))
    assert saved and saved[-1] < 33
    # the kill may land while a checkpoint is being written: resume takes the newest complete one
    complete = [step for step in saved if incomplete_reason(run_dir / f"checkpoint-{step}") is None]
    assert complete  # checkpoint-4 was done before checkpoint-8 began
    log = run_dir / "trainer_log.jsonl"
    if log.read_bytes().endswith(b"\n"):  # the kill may cut the line LLaMA-Factory appends; make sure it did
        log.write_bytes(log.read_bytes() + b'{"current_steps": 9, "total_steps": 33, "lo')
    resumed = run_mpskit("train", "--resume", cwd=tmp_path)  # no RUN_DIR: the newest run
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "ended in a line cut short" in resumed.stderr and log_rows(run_dir)[-1]["current_steps"] == 33
    assert final_state(run_dir)[0] == 33
    attempts = json.loads((run_dir / "mpskit.json").read_text())["attempts"]
    assert attempts[-1]["outcome"] == "finished" and attempts[-1]["resumed_from"] == f"checkpoint-{complete[-1]}"
