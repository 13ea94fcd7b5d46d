"""quantize_embeddings: the embeddings and the output layer packed in the base's bits (quantized_vocab.py).

The packs are bitsandbytes' own quantization, built a chunk of rows at a time; lean logits on a packed
output layer equal lean logits on the same layer dequantized whole; the planner turns it on only where
4 bits of the linear layers alone do not fit; a run with it trains with held-out evaluations, and its
adapter chats, evaluates and exports. (Against LLaMA-Factory's own path on a real trainer:
test_lean_logits.py.)"""

import json
from dataclasses import replace

import pytest
import torch
from conftest import ROOT, run_mpskit

from mpskit.engine import lean_logits, quantized_vocab
from mpskit.errors import MpskitError
from mpskit.plan.advice import plan_run
from mpskit.plan.memory import weight_bytes
from mpskit.settings.resolve import resolve


@pytest.mark.parametrize("bits", [4, 8])
def test_a_table_packed_a_chunk_at_a_time_is_bitsandbytes_own_packing(monkeypatch, bits):
    from bitsandbytes import functional

    torch.manual_seed(0)
    weight = torch.randn(1000, 576, dtype=torch.bfloat16)
    monkeypatch.setattr(quantized_vocab, "PACKING_ROWS_BYTES", 130 * 576 * 2)  # packed 128 rows at a time: 8 chunks
    pack = quantized_vocab.PackedRows(weight, bits)
    if bits == 4:
        packed, state = functional.quantize_4bit(weight, blocksize=64, quant_type="nf4")
        assert torch.equal(pack.packed.view(-1), packed.view(-1)) and torch.equal(pack.scales.view(-1), state.absmax)
        whole = functional.dequantize_4bit(packed, state)
    else:
        packed, scales, _ = functional.int8_vectorwise_quant(weight.float())
        assert torch.equal(pack.packed, packed) and torch.equal(pack.scales.view(-1), scales)
        whole = (packed.float() * scales[:, None] / 127).to(weight.dtype)
    assert pack.nbytes < weight.nbytes * (0.6 if bits == 4 else 1.1)
    assert torch.equal(pack.rows(0, 1000), whole) and torch.equal(pack.rows(333, 517), whole[333:517])
    assert torch.equal(torch.cat([rows for _, _, rows in pack.chunks(77)]), whole)
    ids = torch.tensor([[5, 999, 0], [5, 17, 640]])
    assert torch.equal(pack.gather(ids), whole[ids])


def test_a_table_not_whole_4_bit_blocks_wide_is_refused_in_one_line_and_8_bits_packs_it():
    weight = torch.randn(10, 96)  # 96 = one and a half blocks of 64
    with pytest.raises(MpskitError, match="96 wide, not whole 4-bit blocks of 64") as refused:
        quantized_vocab.PackedRows(weight, 4)
    assert "\n" not in str(refused.value) and refused.value.fix.startswith("set quantization_bit=8")
    assert quantized_vocab.PackedRows(weight, 8).rows(0, 10).shape == (10, 96)


def test_lean_logits_on_a_packed_output_layer_equal_the_layer_dequantized_whole(monkeypatch):
    torch.manual_seed(0)
    pack = quantized_vocab.PackedRows(torch.randn(3000, 64) * 0.1, 4)
    weight = pack.rows(0, 3000)  # the packed layer as a 16-bit (here float32) weight
    monkeypatch.setattr(quantized_vocab, "DEQUANTIZED_ROWS_BYTES", 4 * 64 * 700)  # 700 rows a chunk: 5 chunks
    hidden = torch.randn(500, 64, requires_grad=True)
    targets = torch.randint(0, 3000, (500,))
    upstream = torch.randn(500)

    packed = lean_logits.token_logps(hidden, pack, targets)
    (packed * upstream).sum().backward()
    packed_grad, hidden.grad = hidden.grad, None
    whole = lean_logits.token_logps(hidden, weight, targets)
    (whole * upstream).sum().backward()

    torch.testing.assert_close(packed, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed_grad, hidden.grad, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(lean_logits.token_logps(hidden, pack, targets), whole.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lean_logits.mean_logit_per_position(hidden[None], pack),
                               lean_logits.mean_logit_per_position(hidden[None], weight))  # fmt: skip
    output = quantized_vocab.PackedOutput(pack)
    torch.testing.assert_close(output(hidden[:3]), hidden[:3] @ weight.T)


def plan_of(words: dict):
    return plan_run(resolve(words, hardware="m1-pro-16gb"))


def test_the_planner_packs_the_embeddings_only_where_4_bit_linear_layers_do_not_fit():
    fourteen = plan_of({"stage": "sft", "model_preset": "qwen2.5-14b", "cutoff_len": 1024, "min_cutoff_len": 1024})
    assert fourteen.fits and fourteen.chosen.knobs.quantization_bit == 4 and fourteen.chosen.knobs.quantize_embeddings
    assert any("quantize_embeddings" in change for change in fourteen.changes)
    seven = plan_of({"stage": "foodpo", "model_preset": "qwen2.5-7b", "cutoff_len": 2048})
    assert seven.fits and seven.chosen.knobs.quantization_bit == 4 and not seven.chosen.knobs.quantize_embeddings
    pinned = plan_of({"stage": "sft", "model_preset": "qwen2.5-14b", "cutoff_len": 1024, "min_cutoff_len": 1024,
                      "quantization_bit": 4, "quantize_embeddings": False})  # fmt: skip
    assert not pinned.fits
    # the weights it saves: the two untied 152,064 x 5,120 tables, from 16 bits to 4.5 (a scale per 64)
    knobs = fourteen.chosen.knobs
    saved = weight_bytes(fourteen.dims, replace(knobs, quantize_embeddings=False)) - weight_bytes(fourteen.dims, knobs)
    assert saved == pytest.approx(2 * 152064 * 5120 * (2 - 0.5625), rel=1e-6)


@pytest.mark.e2e
def test_a_packed_run_evaluates_between_steps_then_chats_evaluates_and_exports(tmp_path, tiny_model):
    words = ["preset=dpo", f"model_name_or_path={tiny_model}", "template=qwen", f"dataset_dir={ROOT / 'data'}",
             "cutoff_len=128", "learning_rate=5e-3", "logging_steps=1", "bf16=false", "max_steps=4",
             "save_steps=1000", "eval_strategy=steps", "eval_steps=2", "quantization_bit=4", "quantize_embeddings=true",
             "run_name=q"]  # fmt: skip
    result = run_mpskit("train", *words, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = (tmp_path / "output" / "q" / "latest").resolve()
    record = json.loads((run_dir / "mpskit.json").read_text())
    assert record["mpskit_args"]["quantize_embeddings"] is True
    assert record["attempts"][-1]["lean_logits"]["training"] == "lean"  # the packed layer takes the lean path
    rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 4 and all(loss == loss for loss in losses) and losses[-1] < losses[0]
    assert [row["current_steps"] for row in rows if "eval_loss" in row][:2] == [2, 4]  # trained on after one

    chat = run_mpskit("chat", str(run_dir), "--prompt", "Say hello.", "--max-new-tokens", "4", cwd=tmp_path)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr[-2000:]
    evaluated = run_mpskit("eval", str(run_dir), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    exported = run_mpskit("export", str(run_dir), "-o", str(tmp_path / "merged"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    # the export merges into the 16-bit base: its embeddings are the base's, unchanged
    from safetensors.torch import load_file

    merged, base = load_file(tmp_path / "merged" / "model.safetensors"), load_file(tiny_model / "model.safetensors")
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
