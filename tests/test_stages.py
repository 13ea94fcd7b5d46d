"""Every stage LLaMA-Factory has: pt, rm and kto train through mpskit (run folder, records, recovery)
without a memory plan, and say so; ppo is refused with its reason."""

import json
import math

import pytest
from conftest import ROOT, run_mpskit

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("stage", ["pt", "rm", "kto"])
def test_unplanned_stage_trains_and_says_it_has_no_plan(stage, tmp_path, tiny_model):
    result = run_mpskit(
        "train", f"preset={stage}", f"model_name_or_path={tiny_model}", "template=qwen", f"dataset_dir={ROOT / 'data'}",
        "max_steps=2", "logging_steps=1", "eval_strategy=no", "run_name=stage", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"the memory plan covers sft, dpo, foodpo, not {stage}" in result.stderr
    run_dir = (tmp_path / "output" / "stage" / "latest").resolve()
    attempt = json.loads((run_dir / "mpskit.json").read_text())["attempts"][-1]
    assert attempt["outcome"] == "finished" and attempt["lean_logits"]["asked"] is False
    state = json.loads((run_dir / "trainer_state.json").read_text())
    losses = [row["loss"] for row in state["log_history"] if "loss" in row]
    assert state["global_step"] == 2 and len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert (run_dir / "adapter_model.safetensors").is_file()


def test_plan_for_an_unplanned_stage_is_one_line():
    result = run_mpskit("plan", "preset=rm", "model_preset=qwen2.5-0.5b", "--hardware", "m1-pro-16gb")
    assert result.returncode == 2 and "the memory plan covers sft, dpo, foodpo, not rm" in result.stderr


def test_every_stage_trains_with_resumable_checkpoints():
    from mpskit.engine.bends import RESUMABLE
    from mpskit.stages import STAGES

    resumable_stages = {target.split(".")[2] for target in RESUMABLE.targets}  # llamafactory.train.<stage>...
    assert {name for name, stage in STAGES.items() if not stage.lean} == resumable_stages


@pytest.mark.parametrize("stage", [pytest.param("pt", marks=pytest.mark.slow), "rm", "kto"])  # pt: make test-all
def test_unplanned_stage_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(stage, tmp_path, tiny_model):
    words = ["train", f"preset={stage}", f"model_name_or_path={tiny_model}", "template=qwen",
             f"dataset_dir={ROOT / 'data'}", "max_steps=4", "save_steps=2", "logging_steps=1",
             "eval_strategy=no"]  # fmt: skip
    whole = run_mpskit(*words, "run_name=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run_mpskit(*words, "run_name=killed", cwd=tmp_path, env={"MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP": "2"})
    assert killed.returncode < 0
    run_dir = (tmp_path / "output" / "killed" / "latest").resolve()
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (run_dir / ".saving").exists()  # written under .saving/, then renamed in whole
    resumed = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    attempt = json.loads((run_dir / "mpskit.json").read_text())["attempts"][-1]
    assert attempt["outcome"] == "finished" and attempt["resumed_from"] == "checkpoint-2"

    def train_loss(name: str) -> float:
        folder = (tmp_path / "output" / name / "latest").resolve()
        return json.loads((folder / "all_results.json").read_text())["train_loss"]

    # the mean over all 4 steps, as uninterrupted: resumable.py puts the first 2 steps' losses back. rm
    # resumes without its value head's training (LLaMA-Factory keeps it outside the weights transformers
    # loads on a resume), so its later steps differ a little
    assert train_loss("killed") == pytest.approx(train_loss("whole"), rel=1e-4 if stage != "rm" else 1e-2)
