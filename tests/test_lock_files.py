"""Lock files mpskit did not make: a hard link, a FIFO or the user's own file where mpskit keeps a lock
note is refused in one line naming it and never written. (A killed writer's half-written folder, cleared
by the next writer: test_use_run.py.)"""

import os
import subprocess
import sys

import pytest
from conftest import run_mpskit

from mpskit.rundir.record import Attempt, RunRecord, write_record

ADAPTER = b"the adapter's bytes"


def finished_run(tmp_path):
    run_dir = tmp_path / "output" / "f" / "20260101-000000"
    run_dir.mkdir(parents=True)
    write_record(run_dir, RunRecord(run_name="f", stage="sft", device="cpu", attempts=[Attempt(1, outcome="finished")]))
    (run_dir / "llamafactory.yaml").write_text("stage: sft\n")
    (run_dir / "adapter_model.safetensors").write_bytes(ADAPTER)
    (run_dir / "adapter_config.json").write_text("{}")
    return run_dir


def mpskit_at_most(seconds: float, *words: str, cwd) -> subprocess.CompletedProcess:
    """A fresh process, so that a command that hangs on an open fails the test instead of holding it."""
    command = [sys.executable, "-m", "mpskit.cli", *words]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=seconds)


@pytest.mark.parametrize("plant", ["hard link", "FIFO", "own file"])
def test_a_run_folders_lock_note_that_mpskit_did_not_make_is_refused_and_left_alone(tmp_path, plant):
    run_dir = finished_run(tmp_path)
    note = run_dir / ".mpskit.lock"
    if plant == "hard link":  # a copied or unpacked folder: tar keeps hard links
        os.link(run_dir / "adapter_model.safetensors", note)
    elif plant == "FIFO":
        os.mkfifo(note)
    else:
        note.write_text("my notes\n")
    for words in (["train", "--resume", str(run_dir)], ["export", str(run_dir), "-o", str(tmp_path / "merged")]):
        result = mpskit_at_most(60, *words, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert f"{note} is a" in result.stderr and f"move {note} away" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert (run_dir / "adapter_model.safetensors").read_bytes() == ADAPTER
    assert plant != "own file" or note.read_text() == "my notes\n"


def test_a_stale_note_of_mpskits_own_is_replaced_and_goes_with_its_holder(tmp_path):
    run_dir = finished_run(tmp_path)
    (run_dir / ".mpskit.lock").write_text("process 4242 (mpskit train)")  # a killed run's
    result = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0 and "already finished" in result.stderr, result.stderr
    assert not (run_dir / ".mpskit.lock").exists()


@pytest.mark.parametrize("plant", ["hard link", "FIFO", "own file"])
def test_an_output_paths_lock_file_that_mpskit_did_not_make_is_refused_and_left_alone(tmp_path, plant):
    target, lock, victim = tmp_path / "run.yaml", tmp_path / ".run.yaml.lock", tmp_path / "victim.txt"
    victim.write_text("mine\n")
    if plant == "hard link":
        os.link(victim, lock)
    elif plant == "FIFO":
        os.mkfifo(lock)
    else:
        lock.write_text("mine\n")
    result = mpskit_at_most(60, "config", "preset=sft", "model_preset=tiny", "-o", str(target), cwd=tmp_path)
    assert result.returncode == 2 and f"{lock} is a" in result.stderr and "move" in result.stderr, result.stderr
    assert victim.read_text() == "mine\n" and not target.exists()
    assert plant == "FIFO" or lock.read_text() == "mine\n"


def test_using_a_run_that_is_training_now_says_so_and_not_to_resume_it(tmp_path):
    """A run another process is training has no finished adapter yet: the line names that process
    (its resume would be refused as in use)."""
    run_dir = finished_run(tmp_path)
    write_record(run_dir, RunRecord(run_name="f", stage="sft", device="cpu", attempts=[]))
    hold = ("import sys, time; from pathlib import Path; from mpskit.lock_files import hold_folder\n"
            "with hold_folder(Path(sys.argv[1]), Path(sys.argv[1]) / '.mpskit.lock', 'mpskit train'):\n"
            "    print('held', flush=True); time.sleep(60)")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = mpskit_at_most(60, "export", str(run_dir), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"mpskit: error: {run_dir} is still training (process {holder.pid} (mpskit train)); wait until it ends, "
        "then run this again"
    ]
