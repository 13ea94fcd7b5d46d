"""The run folder as one owned object, on real (tiny) training runs: a kill right after the last
checkpoint resumes to "finished" without another step; a copied run resumes in the copy and only
there; one process at a time; chat/export/eval refuse a run that stopped early; `latest` moves only
once training starts."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_mpskit

pytestmark = pytest.mark.e2e
WORDS = ["train", "preset=sft", "template=qwen", f"dataset_dir={ROOT / 'data'}", "dataset=demo_sft",
         "cutoff_len=128", "learning_rate=5e-3", "max_steps=6", "save_steps=3", "logging_steps=1", "eval_dataset=",
         "eval_strategy=no"]  # fmt: skip
KILL_AFTER_SAVE = "MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP"


def killed_run(tmp_path: Path, tiny_model: Path, step: int, name: str = "run") -> Path:
    """A run killed (SIGKILL) right after the checkpoint of STEP was saved; its folder."""
    result = run_mpskit(*WORDS, f"model_name_or_path={tiny_model}", f"run_name={name}", cwd=tmp_path,
                        env={KILL_AFTER_SAVE: str(step)})  # fmt: skip
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    return (tmp_path / "output" / name / "latest").resolve()


def attempts(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "mpskit.json").read_text())["attempts"]


def logged_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    return [row["current_steps"] for row in rows if "loss" in row]


def digest(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(folder.rglob("*"))
    }


def outside(run_dir: Path, root: Path) -> list[Path]:
    """Every path under ROOT but those inside RUN_DIR (reached directly or through `latest`)."""
    return sorted(path for path in root.rglob("*") if run_dir not in path.resolve().parents)


def test_a_kill_after_the_last_checkpoint_resumes_to_finished_without_another_step(tmp_path, tiny_model):
    run_dir = killed_run(tmp_path, tiny_model, step=6)
    assert (run_dir / "checkpoint-6").is_dir() and attempts(run_dir) == []  # killed before the end was recorded
    latest = tmp_path / "output" / "run" / "latest"
    resumed = run_mpskit("train", "--resume", str(latest), cwd=tmp_path)  # the command mpskit prints
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert latest.resolve() == run_dir
    assert attempts(run_dir)[-1]["outcome"] == "finished" and attempts(run_dir)[-1]["resumed_from"] == "checkpoint-6"
    assert max(logged_steps(run_dir)) == 6 and not (run_dir / "checkpoint-7").exists()
    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    # loss.png is drawn from this history: the killed attempt's steps are in it
    assert [row["step"] for row in state["log_history"] if "loss" in row] == [1, 2, 3, 4, 5, 6]
    assert (run_dir / "loss.png").stat().st_size > 10_000
    results = json.loads((run_dir / "all_results.json").read_text())
    assert (run_dir / "adapter_model.safetensors").is_file() and "train_loss" in results
    # timed over the killed attempt's 6 steps too, not the resumed one's none (0.001 s, 40,000 samples/s)
    rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    logged_runtime = max(row.get("train_runtime", 0) for row in rows if "loss" in row)
    assert results["train_runtime"] >= logged_runtime > 0.1


def test_resume_of_a_copy_trains_the_copy_only_and_leaves_the_original_byte_identical(tmp_path, tiny_model):
    original = killed_run(tmp_path, tiny_model, step=3)
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(original, copy, symlinks=True)
    before = digest(original)
    resumed = run_mpskit("train", "--resume", str(copy), cwd=tmp_path / "elsewhere")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert digest(original) == before
    assert attempts(copy)[-1]["outcome"] == "finished" and attempts(copy)[-1]["resumed_from"] == "checkpoint-3"
    assert max(logged_steps(copy)) == 6 and (copy / "checkpoint-6").is_dir()
    assert str(original) not in (copy / "llamafactory.yaml").read_text()


def test_a_second_process_on_a_run_folder_is_refused_and_told_who_holds_it(tmp_path, tiny_model):
    run_dir = killed_run(tmp_path, tiny_model, step=3)
    first = subprocess.Popen([sys.executable, "-m", "mpskit.cli", "train", "--resume", str(run_dir)], cwd=tmp_path,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    deadline = time.time() + 300  # a guard against a hang, not a speed target
    note = run_dir / ".mpskit.lock"  # the killed run's note may still be there: wait for the first's own
    while not (note.exists() and f"process {first.pid} " in note.read_text()):
        assert time.time() < deadline and first.poll() is None, "the first resume never took the folder"
        time.sleep(0.05)
    second = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert f"is in use by process {first.pid} (mpskit train)" in second.stderr
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    assert [a["outcome"] for a in attempts(run_dir)] == ["finished"]  # one attempt trained steps 4-6, once
    assert logged_steps(run_dir) == [1, 2, 3, 4, 5, 6] and not (run_dir / ".mpskit.lock").exists()


def test_chat_export_and_eval_refuse_a_run_that_stopped_early(tmp_path, tiny_model):
    run_dir = killed_run(tmp_path, tiny_model, step=3)
    for name in ("adapter_model.safetensors", "adapter_config.json"):  # as LLaMA-Factory's save on a signal does
        shutil.copy(run_dir / "checkpoint-3" / name, run_dir / name)
    for words in (["chat", "--prompt", "hi"], ["export", "-o", str(tmp_path / "merged")], ["eval", "--dataset", "x"]):
        result = run_mpskit(*words, str(run_dir), cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "did not finish" in result.stderr and "--allow-unfinished" in result.stderr
    assert not (tmp_path / "merged").exists()
    chat = run_mpskit("chat", "--prompt", "hi", "--max-new-tokens", "4", "--allow-unfinished", str(run_dir),
                      cwd=tmp_path)  # fmt: skip
    assert chat.returncode == 0, chat.stderr[-2000:]
    assert "did not finish" in chat.stderr and "using the adapter it saved there" in chat.stderr

    data = tmp_path / "data"  # a dataset whose name climbs out of the folder its results go to
    data.mkdir()
    shutil.copy(ROOT / "data" / "demo_pref_eval.json", data / "pairs.json")
    info = {"../../x": {"file_name": "pairs.json", "ranking": True, "columns": {"prompt": "instruction",
            "query": "input", "chosen": "chosen", "rejected": "rejected"}}}  # fmt: skip
    (data / "dataset_info.json").write_text(json.dumps(info))
    before = outside(run_dir, tmp_path)
    evaluated = run_mpskit("eval", "--allow-unfinished", "--dataset", "../../x", "--dataset-dir", str(data),
                           str(run_dir), cwd=tmp_path)  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert outside(run_dir, tmp_path) == before
    assert [p.parent.name for p in run_dir.glob("eval/*/all_results.json")][0].startswith("_.._x-")


def test_latest_stays_on_the_last_run_that_started(tmp_path, tiny_model):
    good = killed_run(tmp_path, tiny_model, step=3, name="same")
    from safetensors.torch import load_file, save_file

    odd = tmp_path / "odd-model"  # every file there, one weight of the wrong shape: fails only when loaded
    shutil.copytree(tiny_model, odd)
    tensors = load_file(odd / "model.safetensors")
    key = next(key for key in tensors if key.endswith("q_proj.weight"))
    tensors[key] = tensors[key][:, :-1].contiguous()
    save_file(tensors, odd / "model.safetensors", metadata={"format": "pt"})
    broken = run_mpskit(*WORDS, f"model_name_or_path={odd}", "run_name=same", cwd=tmp_path)
    assert "size mismatch" in broken.stderr.lower() or "shape" in broken.stderr.lower(), broken.stderr[-2000:]
    assert broken.returncode != 0 and len(list((tmp_path / "output" / "same").iterdir())) == 3
    assert (tmp_path / "output" / "same" / "latest").resolve() == good


def test_a_damaged_record_is_one_line_and_is_rebuilt_from_the_folder(tmp_path, tiny_model):
    run_dir = killed_run(tmp_path, tiny_model, step=3)
    record = run_dir / "mpskit.json"
    cut = record.read_bytes()[:100]  # damaged from outside: mpskit's own writes are atomic
    record.write_bytes(cut)
    refused = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "not a readable run record" in refused.stderr and "--rebuild-record" in refused.stderr
    rebuilt = run_mpskit("train", "--resume", str(run_dir), "--rebuild-record", cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert (run_dir / "mpskit.json.damaged").read_bytes() == cut
    assert [(a["outcome"], a["resumed_from"]) for a in attempts(run_dir)] == [
        ("unknown (record rebuilt)", None),
        ("finished", "checkpoint-3"),
    ]
    assert max(logged_steps(run_dir)) == 6
