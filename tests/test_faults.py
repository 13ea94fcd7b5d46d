"""Faults during real (tiny) training runs: a full disk, signals while loading and twice in a row, a
model that trains to NaN, and every rung of the out-of-memory ladder for every stage. Each ends with
a record in mpskit.json and, where there is something to resume, a run that --resume finishes."""

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
from conftest import ROOT, run_mpskit, tmpfs

from mpskit.rundir.checkpoints import checkpoints, incomplete_reason

pytestmark = pytest.mark.e2e
SHORT = ["template=qwen", f"dataset_dir={ROOT / 'data'}", "cutoff_len=128", "learning_rate=5e-3", "max_steps=8",
         "save_steps=2", "logging_steps=1", "eval_dataset=", "eval_strategy=no"]  # fmt: skip
STAGE_DATA = {"sft": ["dataset=demo_sft"], "dpo": ["dataset=demo_pref"], "foodpo": ["dataset=demo_pref"]}


def run_dir_of(tmp_path: Path, name: str) -> Path:
    return (tmp_path / "output" / name / "latest").resolve()


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "mpskit.json").read_text())


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "all_results.json").read_text())


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "mpskit: error:" in line]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_full_disk_stops_keeps_the_last_checkpoint_and_resume_finishes_the_same_run(tmp_path, tiny_model):
    # the presets' logging_steps: the resumed checkpoint-4 comes before any logged step
    short = [word if word != "logging_steps=1" else "logging_steps=5" for word in SHORT]
    words = ["train", "preset=sft", f"model_name_or_path={tiny_model}", *short]
    whole = run_mpskit(*words, "run_name=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]

    full = run_mpskit(*words, "run_name=full", cwd=tmp_path, env={"MPSKIT_FAKE_FULL_DISK_AT_STEP": "6"})
    run_dir = run_dir_of(tmp_path, "full")
    assert full.returncode == 2
    line = error_line(full.stderr)
    assert (
        "is full" in line
        and "checkpoint-4" in line
        and f"mpskit train --resume {run_dir.relative_to(tmp_path)}" in line
    )
    assert [p.name for p in checkpoints(run_dir)] == ["checkpoint-2", "checkpoint-4"]  # the cut save never appears
    assert (run_dir / ".saving" / "checkpoint-6").is_dir()
    assert record(run_dir)["attempts"][-1]["outcome"] == "error: disk full"

    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    attempts = record(run_dir)["attempts"]
    assert attempts[-1]["outcome"] == "finished" and attempts[-1]["resumed_from"] == "checkpoint-4"
    assert [p.name for p in checkpoints(run_dir)] == [f"checkpoint-{n}" for n in (2, 4, 6, 8)]
    assert all(incomplete_reason(p) is None for p in checkpoints(run_dir)) and not (run_dir / ".saving").exists()
    # the mean over all 8 steps, as in the uninterrupted run (not the resumed steps over all 8)
    assert results(run_dir)["train_loss"] == pytest.approx(
        results(run_dir_of(tmp_path, "whole"))["train_loss"], rel=1e-4
    )


def start(tmp_path: Path, tiny_model: Path, name: str, steps: int, env: dict | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "mpskit.cli", "train", "preset=sft", f"model_name_or_path={tiny_model}", *SHORT,
               f"max_steps={steps}", f"run_name={name}"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )


def wait_for(condition, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.02)


def test_sigterm_while_the_model_loads_ends_with_a_record_and_resume_starts_it_again(tmp_path, tiny_model):
    child = start(tmp_path, tiny_model, "early", steps=4)
    wait_for(lambda: list((tmp_path / "output" / "early").glob("*/mpskit.json")))
    time.sleep(0.3)  # into the attempt: the dataset and the model load for some seconds more
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "stopped before any checkpoint was saved" in stderr.splitlines()[-1]
    run_dir = next((tmp_path / "output" / "early").glob("*/mpskit.json")).parent
    assert not (run_dir.parent / "latest").exists()  # latest moves only once training has started
    assert record(run_dir)["attempts"][-1]["outcome"] == "stopped by SIGTERM before training began"
    assert not checkpoints(run_dir)
    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0 and "training it again from step 0" in resumed.stderr, resumed.stderr[-3000:]
    attempts = record(run_dir)["attempts"]
    assert attempts[-1]["outcome"] == "finished" and attempts[-1]["resumed_from"] is None


def test_a_stop_a_library_swallows_before_training_still_ends_the_attempt(tmp_path, tiny_model):
    """`datasets` hashes the tokenizing transform inside a bare `except:`: a SIGTERM there used to raise
    the guard's stop into it, and the run trained on to the end with exit 0."""
    child = start(tmp_path, tiny_model, "swallowed", steps=2, env={"MPSKIT_FAKE_SIGNAL_IN_HASHING": "SIGTERM"})
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stderr[-3000:]
    assert "couldn't be hashed properly" in stderr  # the signal did land inside datasets' `except:`
    run_dir = next((tmp_path / "output" / "swallowed").glob("*/mpskit.json")).parent
    assert record(run_dir)["attempts"][-1]["outcome"] == "stopped by SIGTERM before training began"
    assert not checkpoints(run_dir) and not (run_dir / "trainer_log.jsonl").exists()


SWALLOWED_EXIT = """
import os, signal
from mpskit.temporary import exit_if_signalled, install_sigterm_exit

install_sigterm_exit()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(10))  # the handler runs here, within the try
except:  # a library's import guard
    pass
exit_if_signalled()  # train() asks before it makes the run folder
print("went on")
"""


def test_a_sigterm_a_library_swallows_before_the_run_folder_still_exits():
    done = subprocess.run([sys.executable, "-c", SWALLOWED_EXIT], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 128 + signal.SIGTERM and "went on" not in done.stdout, done.stderr


def test_two_sigterms_stop_at_once_and_keep_the_last_complete_checkpoint(tmp_path, tiny_model):
    child = start(tmp_path, tiny_model, "twice", steps=200)
    log = tmp_path / "output" / "twice" / "latest" / "trainer_log.jsonl"
    wait_for(lambda: log.is_file() and len(log.read_text().splitlines()) >= 5)
    child.send_signal(signal.SIGTERM)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 130, stderr[-3000:]
    run_dir = run_dir_of(tmp_path, "twice")
    assert "Traceback" not in stderr and "the newest complete checkpoint is checkpoint-" in stderr.splitlines()[-1]
    assert record(run_dir)["attempts"][-1]["outcome"].startswith("stopped by SIGTERM")
    assert checkpoints(run_dir) and all(incomplete_reason(p) is None for p in checkpoints(run_dir))
    # the summary comes before the stop's own line: how far it got, and the checkpoint it names
    newest = checkpoints(run_dir)[-1].relative_to(tmp_path)
    assert stderr.splitlines()[-2] == f"mpskit: newest complete checkpoint: {newest}"
    assert any(line.startswith("mpskit: sft run stopped by SIGTERM") for line in stderr.splitlines())


def nan_model(tiny_model: Path, out: Path) -> Path:
    """The tiny model with one NaN in its final norm: every loss is NaN from the first step."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    for path in tiny_model.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    weights = out / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.norm.weight"][0] = math.nan
    save_file(tensors, weights, metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_a_run_that_trains_to_nan_stops_there_and_is_not_a_success(tmp_path, tiny_model, stage):
    model = nan_model(tiny_model, tmp_path / "nan-model")
    result = run_mpskit("train", f"preset={stage}", f"model_name_or_path={model}", *SHORT, *STAGE_DATA[stage],
                        "run_name=nan", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "training diverged at step 1" in error_line(result.stderr)
    run_dir = run_dir_of(tmp_path, "nan")
    assert record(run_dir)["attempts"][-1]["outcome"].startswith("error: training diverged at step 1")
    assert not checkpoints(run_dir) and not (run_dir / "all_results.json").exists()


# Each rung alone: the knobs that would take an earlier rung are pinned, the rung's own is free.
RUNGS = {
    "checkpointing": ["per_device_train_batch_size=2", "gradient_accumulation_steps=2", "lora_rank=8"],
    "batch": ["disable_gradient_checkpointing=false", "lora_rank=8"],
    "lora_rank": ["disable_gradient_checkpointing=false", "per_device_train_batch_size=1",
                  "gradient_accumulation_steps=4"],
    "cutoff_len": ["disable_gradient_checkpointing=false", "per_device_train_batch_size=1",
                   "gradient_accumulation_steps=4", "lora_rank=8", "min_cutoff_len=64"],
}  # fmt: skip
MOVES = {
    "checkpointing": {"disable_gradient_checkpointing"},
    "batch": {"per_device_train_batch_size", "gradient_accumulation_steps"},
    "lora_rank": {"lora_rank"},
    "cutoff_len": {"cutoff_len"},
}


# In make test: SFT's rungs but the micro-batch (test_recovery's synthetic out-of-memory run takes it),
# one rung each for DPO and fooDPO; the others in make test-all.
IN_MAKE_TEST = {("sft", "checkpointing"), ("sft", "lora_rank"), ("sft", "cutoff_len"), ("dpo", "checkpointing"),
                ("foodpo", "lora_rank")}  # fmt: skip
LADDER_CASES = [
    pytest.param(stage, rung, marks=[] if (stage, rung) in IN_MAKE_TEST else [pytest.mark.slow])
    for stage in STAGE_DATA for rung in RUNGS
]


@pytest.mark.parametrize(("stage", "rung"), LADDER_CASES)
def test_every_rung_of_the_ladder_ends_in_a_finished_run(tmp_path, tiny_model, stage, rung):
    words = [f"preset={stage}", f"model_name_or_path={tiny_model}", *[w for w in SHORT if "cutoff_len" not in w]]
    words += [*STAGE_DATA[stage], "max_steps=4", *RUNGS[rung], *([] if rung == "cutoff_len" else ["cutoff_len=128"])]
    result = run_mpskit("train", *words, "run_name=ladder", cwd=tmp_path, env={"MPSKIT_FAKE_OOM_AT_STEP": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_dir_of(tmp_path, "ladder")
    first, second = record(run_dir)["attempts"]
    assert first["outcome"] == "out of memory" and second["outcome"] == "finished"
    moved = {key for key, value in second["knobs"].items() if first["knobs"][key] != value}
    assert moved == MOVES[rung], (first["knobs"], second["knobs"])
    memory = record(run_dir)["memory"]  # the rung's own plan, which the attempt after it is measured against
    assert memory["predicted"]["training_gb"] == second["predicted_gb"] <= first["predicted_gb"]
    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    assert all(math.isfinite(row["loss"]) for row in state["log_history"] if "loss" in row)
    if rung == "lora_rank":  # a new adapter: restarted from step 0, the old rank's checkpoint kept aside
        assert second["resumed_from"] is None and (run_dir / "checkpoint-2.rank-8").is_dir()
        assert json.loads((run_dir / "adapter_config.json").read_text())["r"] == 4
    else:
        assert second["resumed_from"] == "checkpoint-2"


def test_resume_from_checkpoint_of_another_run_is_honoured(tmp_path, tiny_model):
    words = ["train", "preset=sft", f"model_name_or_path={tiny_model}", *SHORT]
    first = run_mpskit(*words, "max_steps=4", "run_name=first", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = run_dir_of(tmp_path, "first") / "checkpoint-2"
    second = run_mpskit(*words, f"resume_from_checkpoint={checkpoint}", "run_name=second", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    run_dir = run_dir_of(tmp_path, "second")
    assert record(run_dir)["attempts"][-1]["resumed_from"] == "checkpoint-2"
    steps = [json.loads(line)["current_steps"] for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert steps[0] == 3 and json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 8


@pytest.fixture
def small_disk(tmp_path):
    """A real 160 MB filesystem (tmpfs) for the run folder, where this machine lets a test mount one."""
    with tmpfs(tmp_path / "disk", "160m", "; the faked ENOSPC tests cover the same paths") as disk:
        yield disk


def test_a_real_full_disk_mid_run_keeps_the_record_and_resume_finishes(tmp_path, tiny_model, small_disk):
    """The run is paused right after its first checkpoint, the disk filled to its last 32 KB, and the
    run continued: whatever write fails next (a log line, a checkpoint, the record), it stops with one
    line, mpskit.json stays whole, and once space is freed --resume finishes the same run."""
    run_dir = small_disk / "run"
    command = [sys.executable, "-m", "mpskit.cli", "train", "preset=sft", f"model_name_or_path={tiny_model}", *SHORT,
               "memory_budget_gb=1000", f"output_dir={run_dir}"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=env)
    wait_for(lambda: (run_dir / "checkpoint-2").is_dir() or child.poll() is not None)
    child.send_signal(signal.SIGSTOP)
    filler = small_disk / "filler"
    with filler.open("wb") as file:
        file.write(b"\0" * (os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize - 32 * 1024))
    child.send_signal(signal.SIGCONT)
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 2, stderr[-3000:]
    line = error_line(stderr)
    assert "is full" in line and f"mpskit train --resume {run_dir}" in line
    assert record(run_dir)["attempts"][-1]["outcome"] == "error: disk full"  # or the record it had: whole
    filler.unlink()
    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert record(run_dir)["attempts"][-1]["outcome"] == "finished"
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 8


def test_a_kill_after_a_rung_resumes_with_what_the_rung_chose(tmp_path, tiny_model):
    """Out of memory at step 3 lowers the LoRA rank (a new adapter from step 0); that attempt is
    killed right after its checkpoint of step 4. The resume continues the rank-4 adapter from it:
    llamafactory.yaml and the record say what trained, not the first attempt's knobs."""
    words = ["preset=sft", f"model_name_or_path={tiny_model}", *[w for w in SHORT if not w.startswith("max_steps")],
             *STAGE_DATA["sft"], "max_steps=6", *RUNGS["lora_rank"]]  # fmt: skip
    env = {"MPSKIT_FAKE_OOM_AT_STEP": "3", "MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP": "4"}
    killed = run_mpskit("train", *words, "run_name=rung-kill", cwd=tmp_path, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    run_dir = run_dir_of(tmp_path, "rung-kill")
    assert yaml.safe_load((run_dir / "llamafactory.yaml").read_text())["lora_rank"] == 4
    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, last = record(run_dir)["attempts"]
    assert first["outcome"] == "out of memory" and first["knobs"]["lora_rank"] == 8
    assert last["outcome"] == "finished" and last["resumed_from"] == "checkpoint-4" and last["knobs"]["lora_rank"] == 4
    assert json.loads((run_dir / "adapter_config.json").read_text())["r"] == 4
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 6


def test_a_closed_terminal_saves_a_checkpoint_records_the_stop_and_resume_finishes(tmp_path, tiny_model):
    """SIGHUP (the terminal closed) is a stop like SIGTERM: a checkpoint at the end of the step, the
    attempt recorded, the lock note gone."""
    child = start(tmp_path, tiny_model, "hup", steps=6)
    log = tmp_path / "output" / "hup" / "latest" / "trainer_log.jsonl"
    wait_for(lambda: log.is_file() and len(log.read_text().splitlines()) >= 2)
    child.send_signal(signal.SIGHUP)
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    run_dir = run_dir_of(tmp_path, "hup")
    assert record(run_dir)["attempts"][-1]["outcome"] == "stopped by SIGHUP"
    assert checkpoints(run_dir) and not (run_dir / ".mpskit.lock").exists()
    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 6


@pytest.mark.parametrize(("name", "delay_s"), [("SIGINT", 0.1), pytest.param("SIGTERM", 0.4, marks=pytest.mark.slow)])
def test_the_out_of_memory_re_exec_imports_what_the_first_process_did_and_keeps_a_signal(
    tmp_path, tiny_model, name, delay_s
):
    """`mpskit train` (the console script) in a folder that holds a datasets.py, out of memory at step 3:
    the fresh process of the next rung imports the library, not the folder's file; a signal 0.1-0.5 s
    after the rung's line is recorded as the stop of that new attempt (not a fatal error at start-up,
    not the folder's datasets.py), and --resume finishes the run."""
    (tmp_path / "datasets.py").write_text("raise RuntimeError('the working folder was imported')\n")
    words = ["train", "preset=sft", f"model_name_or_path={tiny_model}", *SHORT, *STAGE_DATA["sft"], "max_steps=6",
             *RUNGS["batch"], "run_name=rung"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPSKIT_FAKE_OOM_AT_STEP": "3"}
    script = Path(sys.executable).with_name("mpskit")
    child = subprocess.Popen([str(script), *words], cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in child.stderr:
        lines.append(line)
        if "in a fresh process" in line:
            time.sleep(delay_s)
            child.send_signal(getattr(signal, name))
    child.wait(timeout=300)
    stderr = "".join(lines)
    assert "Fatal Python error" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    run_dir = run_dir_of(tmp_path, "rung")
    outcomes = [attempt["outcome"] for attempt in record(run_dir)["attempts"]]
    assert child.returncode == 130 and outcomes == ["out of memory", f"stopped by {name} before training began"]
    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert record(run_dir)["attempts"][-1]["outcome"] == "finished"


def test_sighup_right_after_the_run_folder_is_made_is_recorded_and_the_resume_line_finishes_it(tmp_path, tiny_model):
    """The moment between the folder's creation and the attempt's own guard (plugins/faults.py)."""
    child = start(tmp_path, tiny_model, "window", steps=2, env={"MPSKIT_FAKE_SIGNAL_AFTER_RUN_FOLDER": "SIGHUP"})
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    [run_dir] = [path.parent for path in (tmp_path / "output" / "window").glob("*/mpskit.json")]
    assert record(run_dir)["attempts"] == [
        {**record(run_dir)["attempts"][0], "attempt": 1, "outcome": "stopped by SIGHUP before training began"}
    ]
    resume_line = stderr.splitlines()[-1]
    assert resume_line.endswith(f"start it again with: mpskit train --resume {run_dir.relative_to(tmp_path)}")
    resumed = run_mpskit(*resume_line.split(": mpskit ", 1)[1].split(), cwd=tmp_path)
    assert resumed.returncode == 0 and record(run_dir)["attempts"][-1]["outcome"] == "finished", resumed.stderr[-3000:]


def test_sigterm_as_the_summary_ends_only_notes_itself(tmp_path, tiny_model):
    child = start(tmp_path, tiny_model, "ending", steps=2, env={"MPSKIT_FAKE_SIGNAL_AFTER_SUMMARY": "SIGTERM"})
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 0 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    assert "mpskit: SIGTERM came as the run's end was recorded; it ends as recorded" in stderr
    assert record(run_dir_of(tmp_path, "ending"))["attempts"][-1]["outcome"] == "finished"


def test_a_reader_that_stops_reading_does_not_end_the_run(tmp_path, tiny_model):
    """The progress lines go to a pipe whose reader closes it after the first one (EPIPE from then on)."""
    child = start(tmp_path, tiny_model, "unread", steps=6)
    while not child.stderr.readline().startswith("mpskit: step"):
        pass
    child.stderr.close()
    assert child.wait(timeout=300) == 0
    run_dir = run_dir_of(tmp_path, "unread")
    assert record(run_dir)["attempts"][-1]["outcome"] == "finished"
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 6


def test_a_resume_after_a_kill_before_the_first_checkpoint_logs_each_step_once(tmp_path, tiny_model):
    """Trained again from step 0, the run logs steps 1, 2... again: the killed attempt's entries move to
    trainer_log.superseded.jsonl (kept), not left before them."""
    command = [sys.executable, "-m", "mpskit.cli", "train", "preset=sft", f"model_name_or_path={tiny_model}", *SHORT,
               "max_steps=6", "save_steps=100", "run_name=early_kill"]  # fmt: skip
    child = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "output" / "early_kill" / "latest" / "trainer_log.jsonl"
    wait_for(lambda: log.is_file() and len(log.read_text().splitlines()) >= 2)
    child.kill()
    child.wait(timeout=60)
    run_dir = run_dir_of(tmp_path, "early_kill")
    assert not checkpoints(run_dir)
    killed = (run_dir / "trainer_log.jsonl").read_text().splitlines()
    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    entries = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert [entry["current_steps"] for entry in entries if "loss" in entry] == [1, 2, 3, 4, 5, 6]
    assert (run_dir / "trainer_log.superseded.jsonl").read_text().splitlines()[: len(killed)] == killed
