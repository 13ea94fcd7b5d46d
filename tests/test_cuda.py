"""What only an NVIDIA GPU shows: DeepSpeed ZeRO-3 over a 4-bit QLoRA base, FSDP, and bitsandbytes' CUDA
kernels, each through `mpskit train` on the tiny model at world size 1 (NCCL refuses two ranks on one GPU).

`make test-cuda` runs them on a CUDA machine; `make test` and `make test-all` leave them out, and a bare
pytest skips them where no GPU is found. Their results on an H200 are kept in bench/results/cuda-checks.json.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_mpskit

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (make test-cuda)"),
]

ZERO3 = ROOT / "mpskit" / "configs" / "deepspeed" / "ds_z3.json"


def one_gpu_run(cwd: Path, tiny_model: Path, name: str, *extra: str) -> tuple[Path, str]:
    """A short LoRA SFT run on the GPU in CWD, evaluated on held-out rows: its folder, and what it said."""
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "cutoff_len=128", "max_steps=4", "logging_steps=1", f"run_name={name}"]  # fmt: skip
    result = run_mpskit("train", *words, *extra, cwd=cwd, env={"NPROC_PER_NODE": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return (cwd / "output" / name / "latest").resolve(), result.stderr


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "trainer_log.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def engine(run: Path) -> dict:
    return json.loads((run / "rank-0.json").read_text())["engine"]


@pytest.fixture(scope="module")
def plain_qlora(tmp_path_factory, tiny_model) -> Path:
    """The same 4-bit run in one process, without DeepSpeed."""
    run, said = one_gpu_run(tmp_path_factory.mktemp("plain"), tiny_model, "plain", "quantization_bit=4")
    assert "trained with" not in said  # one process, no engine to name
    return run


def test_zero3_over_a_4_bit_base_saves_a_real_adapter(tmp_path, tiny_model, plain_qlora):
    """ZeRO-3's config is accepted over bitsandbytes' 4-bit weights, the 16-bit gather on save writes the whole
    adapter (an empty one is what LLaMA-Factory, trl and peft users hit), and it scores in one process as in
    the run. One process through torchrun: accelerate starts DeepSpeed only in a process group."""
    from safetensors.torch import load_file

    run, said = one_gpu_run(tmp_path, tiny_model, "zero3", "quantization_bit=4", f"deepspeed={ZERO3}")
    assert "mpskit: 1 process: torch.distributed.run" in said
    assert "trained with DeepSpeed ZeRO-3 over 1 process, nccl" in said
    ran = engine(run)
    assert ran["distributed_type"] == "DEEPSPEED" and ran["wrapped_model"] == "DeepSpeedEngine", ran
    assert ran["states_share"] == pytest.approx(1.0, abs=0.05) and ran["weights_share"] == pytest.approx(1.0, abs=0.05)
    written = yaml.safe_load((run / "llamafactory.yaml").read_text())
    assert written["quantization_bit"] == 4 and written["deepspeed"] == str(ZERO3)
    assert json.loads((run / "mpskit.json").read_text())["device"] == "cuda"
    assert json.loads((run / "rank-0.json").read_text())["measured"]["training_gb"] > 0
    zero, plain = losses(run), losses(plain_qlora)
    assert len(zero) == 4 and all(math.isfinite(loss) for loss in zero)
    assert zero == pytest.approx(plain, rel=1e-3)  # an H200 gave 4e-5
    adapters = {name: load_file(folder / "adapter_model.safetensors") for name, folder in
                {"zero": run, "plain": plain_qlora}.items()}  # fmt: skip
    assert adapters["zero"].keys() == adapters["plain"].keys()
    for key, tensor in adapters["zero"].items():  # whole shapes, gathered; lora_B trained away from zero
        assert tensor.shape == adapters["plain"][key].shape and tensor.abs().sum() > 0, key
    evaluated = run_mpskit("eval", str(run), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    [figures] = [json.loads(path.read_text()) for path in run.glob("eval/*/all_results.json")]
    trained = json.loads((run / "all_results.json").read_text())
    assert figures["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-3)  # an H200 gave 1e-5


def test_fsdp_on_one_gpu_is_recorded_as_the_engine_that_ran(tmp_path, tiny_model):
    """FSDP frees its 16-bit weights after the forward, so the logits are LLaMA-Factory's (whole_logits_when_sharded).
    With the lean logits path, this run failed on an H200 in its first backward (CUBLAS_STATUS_EXECUTION_FAILED)."""
    config = tmp_path / "fsdp.json"
    config.write_text(json.dumps({"transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"], "use_orig_params": True}))
    run, said = one_gpu_run(tmp_path, tiny_model, "fsdp", "fsdp=full_shard auto_wrap", f"fsdp_config={config}")
    assert "trained with FSDP over 1 process, nccl" in said
    ran = engine(run)
    assert ran["distributed_type"] == "FSDP" and ran["fsdp"] and not ran["deepspeed"], ran
    assert ran["wrapped_model"] == "FullyShardedDataParallel"
    assert json.loads((run / "rank-0.json").read_text())["lean_logits"]["training"] != "lean"
    assert all(math.isfinite(loss) for loss in losses(run)) and len(losses(run)) == 4
    assert (run / "adapter_model.safetensors").stat().st_size > 1000


def test_bitsandbytes_runs_its_cuda_kernels():
    """The 4-bit base of the runs above dequantizes on the GPU: bitsandbytes loaded its CUDA library."""
    import bitsandbytes
    import torch

    assert bitsandbytes.cextension.BNB_BACKEND == "CUDA"
    layer = bitsandbytes.nn.Linear4bit(64, 64, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    assert layer.weight.quant_state is not None
    x = torch.randn(2, 64, device="cuda", dtype=torch.bfloat16)
    assert torch.isfinite(layer(x)).all()
