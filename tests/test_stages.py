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
        "train", f"stage={stage}", f"model_name_or_path={tiny_model}", "template=qwen", f"dataset_dir={ROOT / 'data'}",
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
    result = run_mpskit("plan", "stage=rm", "model_preset=qwen2.5-0.5b", "--hardware", "m1-pro-16gb")
    assert result.returncode == 2 and "the memory plan covers sft, dpo, foodpo, not rm" in result.stderr
