"""The same presets on several processes: the CUDA planner knobs, ZeRO configs, and a real
two-process DDP run on this CPU (gloo) for SFT, DPO and fooDPO through torchrun and mpskit's entry point."""

import json
import math
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_mpskit

from mpskit.machine.hardware import load_hardware
from mpskit.plan.memory import ModelDims
from mpskit.plan.planner import plan

# one at a time: each torchrun takes a free port on loopback
pytestmark = pytest.mark.xdist_group("torchrun")

QWEN25_3B = ModelDims(hidden=2048, layers=36, heads=16, kv_heads=2, ffn=11008, vocab=151936, model_type="qwen2")
ARGS = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "cutoff_len": 512, "lora_rank": 8,
        "bf16": True}  # fmt: skip


def test_qlora_only_when_16_bit_weights_cannot_fit():
    cuda = load_hardware("cuda-24gb")
    assert plan("sft", ARGS, cuda, "cuda", QWEN25_3B, budget_gb=20).chosen.knobs.quantization_bit is None
    tight = plan("sft", ARGS, cuda, "cuda", QWEN25_3B, budget_gb=6)
    assert tight.chosen.knobs.quantization_bit == 4
    assert any("QLoRA" in note for note in tight.changes)
    mac = plan("sft", ARGS, load_hardware("m3-max-64gb"), "mps", QWEN25_3B, budget_gb=6)
    assert mac.chosen.knobs.quantization_bit == 4  # bitsandbytes quantizes on MPS too
    intel = plan("sft", ARGS, load_hardware("intel-mac"), "cpu", QWEN25_3B, budget_gb=6)
    assert intel.chosen is None or intel.chosen.knobs.quantization_bit is None  # no bitsandbytes build there


def test_zero_stage_per_rank_memory():
    node = load_hardware("cuda-8x80gb")
    full = {**ARGS, "finetuning_type": "full"}
    roomy = plan("sft", full, node, "cuda", QWEN25_3B, world_size=8, budget_gb=79)
    assert roomy.chosen.knobs.zero_stage == 2  # the faster stage when both fit
    tight = plan("sft", full, node, "cuda", QWEN25_3B, world_size=8, budget_gb=12)
    assert tight.chosen.knobs.zero_stage == 3
    assert tight.chosen.estimate.parts["weights"] < roomy.chosen.estimate.parts["weights"] / 7


def test_config_for_eight_80gb_gpus_names_a_zero_config_and_bf16(tiny_model, tmp_path):
    out = tmp_path / "lf.yaml"
    result = run_mpskit(
        "config", "preset=foodpo", "model_preset=qwen2.5-3b", f"model_name_or_path={tiny_model}",
        f"dataset_dir={ROOT / 'data'}", "--hardware", "cuda-8x80gb", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(out.read_text())
    assert written["bf16"] is True and written["fp16"] is False
    assert written["deepspeed"].startswith(str(ROOT / "mpskit" / "configs" / "deepspeed"))  # shipped in the package
    zero = json.loads(Path(written["deepspeed"]).read_text())
    assert zero["zero_optimization"]["stage"] in (2, 3)


def test_plan_shows_per_process_memory_for_eight_gpus():
    result = run_mpskit("plan", "preset=foodpo", "model_preset=qwen2.5-3b", "--hardware", "cuda-8x80gb")
    assert result.returncode == 0, result.stderr
    assert "budget     79.00 GB per process" in result.stdout
    assert "per process of 8" in result.stdout and "ZeRO-2" in result.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["sft", pytest.param("dpo", marks=pytest.mark.slow),
                                   pytest.param("foodpo", marks=pytest.mark.slow)])  # fmt: skip
def test_two_processes_train_through_torchrun_on_this_cpu(tmp_path, tiny_model, stage):
    words = [f"preset={stage}", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "cutoff_len=128", "num_train_epochs=1", "logging_steps=2", "device=cpu"]  # fmt: skip
    result = run_mpskit("train", *words, cwd=tmp_path, env={"NPROC_PER_NODE": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 processes: torch.distributed.run" in result.stderr
    run_dir = (tmp_path / "output" / f"{stage}-model" / "latest").resolve()
    ranks = [json.loads((run_dir / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    assert all(r["outcome"] == "finished" and r["measured"]["training_gb"] > 0 for r in ranks)
    assert all(r["lean_logits"]["training"] == "lean" for r in ranks)  # the lean path under DDP
    written = yaml.safe_load((run_dir / "llamafactory.yaml").read_text())
    assert written["ddp_backend"] == "gloo"
    adapters = [p for p in run_dir.rglob("adapter_model.safetensors") if not p.parent.name.startswith("checkpoint")]
    assert adapters == [run_dir / "adapter_model.safetensors"]
    state = json.loads((run_dir / "trainer_state.json").read_text())
    per_step = written["per_device_train_batch_size"] * written["gradient_accumulation_steps"] * 2
    samples = 264  # both demo training sets, SFT and preference pairs, hold 264 examples
    assert state["global_step"] == math.ceil(samples / per_step)
    rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert all(math.isfinite(row["loss"]) for row in rows if "loss" in row)
    if stage == "foodpo":
        assert any("dynamic_beta" in row for row in rows)
