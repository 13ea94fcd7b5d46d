"""Quantized bases (quantization_bit=4: bitsandbytes' NF4 with double quantization; and 8) on the CPU,
which runs the same formats as MPS: SFT, DPO, fooDPO, KTO and RM train through `mpskit train` with
held-out evaluations between their steps and log the losses of plain `llamafactory-cli train` on the
YAML mpskit wrote (fooDPO: of mpskit's run on whole logits), with lean logits and lean attention on and
off. And the loader that reads the checkpoint tensor by tensor gives the tensors safetensors' own memory
map gives."""

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_llamafactory_cli, run_mpskit
from safetensors import safe_open
from safetensors.torch import save_file

from mpskit.engine import quantized
from mpskit.engine.quantized import SafeFileOnDemand

WORDS = ["template=qwen", f"dataset_dir={ROOT / 'data'}", "cutoff_len=128", "learning_rate=5e-3", "logging_steps=1",
         "eval_strategy=no", "bf16=false"]  # fmt: skip
SHORT = ["max_steps=4", "save_steps=1000"]
# Held-out evaluation between the steps, as the stage presets run it: an evaluation in eval mode without
# grad once made bitsandbytes repack 4-bit weights for the CPU, and the next training step failed.
EVALUATED = ["eval_strategy=steps", "eval_steps=2"]


def test_the_loader_reads_what_the_memory_map_reads(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16), "c": torch.arange(6).reshape(2, 3)}
    path = tmp_path / "x.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    with safe_open(path, framework="pt") as mapped, SafeFileOnDemand(path) as read:
        assert read.keys() == list(mapped.keys()) and read.metadata() == mapped.metadata()
        for key in mapped.keys():
            assert read.get_slice(key).get_shape() == mapped.get_slice(key).get_shape()
            assert read.get_slice(key).get_dtype() == mapped.get_slice(key).get_dtype()
            assert torch.equal(read.get_slice(key)[...], mapped.get_tensor(key))
            assert torch.equal(read.get_tensor(key), tensors[key])
    cut = tmp_path / "cut.safetensors"
    save_file({"w": torch.randn(4, 4)}, cut)
    cut.write_bytes(cut.read_bytes()[:-8])
    with SafeFileOnDemand(cut) as read, pytest.raises(OSError, match="ends inside tensor data"):
        read.get_tensor("w")


@pytest.mark.skipif(quantized._MALLOC_TRIM is None, reason="malloc_trim is glibc's (Linux)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine dequantizes on the GPU: nothing is trimmed")
def test_the_heap_is_trimmed_before_each_decoder_layer_and_only_within(tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM

    calls = []
    monkeypatch.setattr(quantized, "trim_heap", lambda: calls.append(1))
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokens = torch.tensor([[1, 17, 230, 5]])
    with quantized.trim_between_layers():
        model(tokens)
    assert len(calls) == model.config.num_hidden_layers
    model(tokens)
    assert len(calls) == model.config.num_hidden_layers


def test_a_merge_shard_by_shard_equals_peft_merge_and_unload(tmp_path, tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mpskit.errors import MpskitError
    from mpskit.tools.merge_shards import merge_by_shard

    base = tmp_path / "base"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(base, max_shard_size="200KB")
    assert len(list(base.glob("*.safetensors"))) > 2
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(tmp_path / "adapter")
    out = tmp_path / "merged"
    out.mkdir()
    (base / "consolidated.safetensors").write_bytes((base / "model-00001-of-00003.safetensors").read_bytes())
    merge_by_shard(base, tmp_path / "adapter", out)  # the files the index names; not Mistral's consolidated copy
    copied = sorted(p.name for p in base.iterdir() if "consolidated" not in p.name)
    assert sorted(p.name for p in out.iterdir()) == copied
    expected = peft_model.merge_and_unload().to(torch.bfloat16).state_dict()  # peft's merge in float32, saved in bf16
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).state_dict()
    assert merged.keys() == expected.keys()
    changed = [key for key in merged if not torch.equal(merged[key], expected[key])]
    assert changed == [] and any("down_proj" in key for key in merged)

    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "use_dora": True}))
    with pytest.raises(MpskitError, match="takes plain LoRA adapters, not use_dora"):
        merge_by_shard(base, tmp_path / "adapter", tmp_path)


def log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]


def losses(run_dir: Path) -> list[float]:
    return [row["loss"] for row in log(run_dir) if "loss" in row]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "stage, bits, lean",
    [("sft", 4, []), ("dpo", 4, []), ("foodpo", 4, ["pref_beta_scale=0.5"]), ("sft", 4, ["lean_attention=true"]),
     ("dpo", 4, ["lean_logits=false", "lean_attention=false"]), ("sft", 8, []), ("kto", 4, []), ("rm", 4, [])],
    ids=["sft", "dpo", "foodpo", "sft-lean-attention", "dpo-lean-off", "sft-8-bit", "kto", "rm"],
)  # fmt: skip
def test_a_quantized_run_logs_the_losses_of_plain_llamafactory(tmp_path, tiny_model, stage, bits, lean):
    words = [f"preset={stage}", f"model_name_or_path={tiny_model}", *WORDS, *SHORT, f"quantization_bit={bits}",
             *EVALUATED, *(["val_size=0.1"] if stage == "kto" else [])]  # KTO's preset holds out no data of its own
    result = run_mpskit("train", *words, *lean, "run_name=mine", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = (tmp_path / "output" / "mine" / "latest").resolve()
    assert f"Quantizing model to {bits} bit with bitsandbytes" in (run_dir / "train.log").read_text()
    assert [row["current_steps"] for row in log(run_dir) if "eval_loss" in row][:2] == [2, 4]  # trained on after one
    if stage == "foodpo":  # LLaMA-Factory has no fooDPO: the reference is mpskit's run on whole logits
        plain = run_mpskit("train", *words, *lean, "lean_logits=false", "run_name=plain", cwd=tmp_path)
        reference = (tmp_path / "output" / "plain" / "latest").resolve()
    else:  # plain LLaMA-Factory evaluates only after its last step: on a CPU with AVX512-BF16 it fails after one
        reference = tmp_path / "cli"
        written = str(run_dir / "llamafactory.yaml")
        plain = run_llamafactory_cli("train", written, f"output_dir={reference}", "eval_steps=1000", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    ours, theirs = losses(run_dir), losses(reference)
    assert len(ours) == len(theirs) == 4 and all(loss == loss for loss in ours)  # finite, every step logged
    # RM's value head has dropout, and an evaluation draws from torch's random stream (each DataLoader
    # iterator takes a seed): after one, its steps draw other masks than a run without it, plain or not
    compared = 2 if stage == "rm" else 4
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5)
    assert ours[1:compared] == pytest.approx(theirs[1:compared], rel=1e-3)
    assert ours[-1] < ours[0]  # it learns on a quantized base


@pytest.mark.e2e
def test_a_4_bit_run_chats_and_evaluates_in_4_bits_and_exports_a_16_bit_merge(tmp_path, tiny_model):
    from gguf_checks import assert_agrees_as_f16, prompt_ids
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    words = ["preset=dpo", f"model_name_or_path={tiny_model}", *WORDS, *SHORT, "quantization_bit=4", "run_name=q"]
    assert run_mpskit("train", *words, cwd=tmp_path).returncode == 0
    run_dir = (tmp_path / "output" / "q" / "latest").resolve()
    chat = run_mpskit("chat", str(run_dir), "--prompt", "Say hello.", "--max-new-tokens", "4", "-v", cwd=tmp_path)
    assert chat.returncode == 0 and "Quantizing model to 4 bit with bitsandbytes" in chat.stderr, chat.stderr[-2000:]
    evaluated = run_mpskit("eval", str(run_dir), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    log = next((run_dir / "eval").glob("*/train.log")).read_text()
    assert log.count("Quantizing model to 4 bit with bitsandbytes") == 2  # the policy, and the base as reference

    out = tmp_path / "merged"  # the 16-bit base merged shard by shard: peft's merge, to 1e-3 in float32
    exported = run_mpskit("export", str(run_dir), "-o", str(out), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert (out / "tokenizer_config.json").is_file() and (out / "model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    expected = PeftModel.from_pretrained(base, run_dir).merge_and_unload().eval()
    tokens = torch.tensor([[1, 17, 230, 5, 99, 401, 12, 7]])
    with torch.no_grad():
        torch.testing.assert_close(merged(tokens).logits, expected(tokens).logits, rtol=1e-3, atol=1e-3)
    gguf = tmp_path / "gguf"  # the same merge streamed into a GGUF file, as llama.cpp computes it
    assert run_mpskit("export", str(run_dir), "--gguf", "f16", "-o", str(gguf), cwd=tmp_path).returncode == 0
    assert_agrees_as_f16(gguf / "q.f16.gguf", merged, prompt_ids(out))


@pytest.mark.e2e
def test_a_4_bit_run_out_of_memory_resumes_on_the_next_rung(tmp_path, tiny_model):
    words = ["preset=sft", f"model_name_or_path={tiny_model}", *WORDS, "quantization_bit=4", "save_steps=2",
             "max_steps=6", "run_name=q"]  # fmt: skip
    result = run_mpskit("train", *words, cwd=tmp_path, env={"MPSKIT_FAKE_OOM_AT_STEP": "3"})
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(((tmp_path / "output" / "q" / "latest") / "mpskit.json").read_text())
    first, second = record["attempts"]
    assert first["outcome"] == "out of memory" and second["outcome"] == "finished"
    assert second["resumed_from"] == "checkpoint-2" and record["llamafactory_args"]["quantization_bit"] == 4
    assert len(losses((tmp_path / "output" / "q" / "latest").resolve())) == 6
