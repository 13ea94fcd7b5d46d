"""The memory model's arithmetic, pinned on hand-computed cases and on real transformers/peft counts."""

from dataclasses import replace

import pytest

from mpskit.machine.allocator import EXACT, GLIBC_HEAP, UNMEASURED
from mpskit.plan.allocators import (
    ACTIVATION_FACTOR,
    AUTOCAST_HALF_HEAP_KEPT_FRACTION,
    EVAL_OVERHEAD_BYTES,
    GLIBC_RUN_OVERHEAD_BYTES,
    GPU_RUN_OVERHEAD_BYTES,
    LOADING_COPIES,
    MMAP_CEILING_BYTES,
    PROFILES,
    TRIMMED_NATIVE_HALF_HEAP,
    WEIGHT_FACTOR,
)
from mpskit.plan.memory import (
    ATTENTION_GRADIENT_COPIES,
    GB,
    LEAN_ATTENTION_BLOCK_COPIES,
    LEAN_CHUNK_BYTES,
    LOGIT_COPIES,
    Knobs,
    ModelDims,
    activation_width,
    attention_block_bytes,
    dims_from_mapping,
    estimate,
    heap_kept,
    layer_activation_elements,
    layer_buffers,
    lean_attention_runs,
)

QWEN25_05B = ModelDims(hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab=151936, model_type="qwen2")
GLIBC = PROFILES[GLIBC_HEAP]
TOY = ModelDims(hidden=64, layers=2, heads=4, kv_heads=2, ffn=256, vocab=1000, model_type="qwen2")


def test_qwen25_05b_parameter_count_is_the_published_one():
    # per layer: q 896*896+896, k and v 2*(896*128+128), o 896*896, MLP 3*896*4864, norms 2*896
    assert QWEN25_05B.layer_params() == 803_712 + 229_632 + 802_816 + 13_074_432 + 1_792
    assert QWEN25_05B.params() == 24 * 14_912_384 + 151936 * 896 + 896 == 494_032_768


def test_lora_on_all_linear_layers_of_qwen25_05b_rank_8():
    # rank x (in + out) over q, k, v, o, gate, up, down = 8 x (9h + 2 kv + 3 ffn) per layer;
    # peft prints "trainable params: 4,399,104" for this model and setting.
    assert QWEN25_05B.lora_params(8) == 24 * 8 * (9 * 896 + 2 * 128 + 3 * 4864) == 4_399_104


def test_counts_match_transformers_and_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, vocab_size=1000, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == TOY.params()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = get_peft_model(model, LoraConfig(r=16, target_modules=targets))
    assert sum(p.numel() for p in lora.parameters() if p.requires_grad) == TOY.lora_params(16)


def test_weights_are_counted_at_the_checkpoints_dtype_and_activations_at_the_autocast_or_its_own():
    """LLaMA-Factory loads with torch_dtype="auto": a float32 checkpoint keeps float32 weights under bf16, a
    bf16 one keeps bf16 weights under float32, and without autocast it computes in bf16 (measured on the
    real model: bench/real.py)."""
    hf = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
          "intermediate_size": 4864, "vocab_size": 151936}  # fmt: skip
    fp32_checkpoint = dims_from_mapping({**hf, "dtype": "float32"})
    bf16_checkpoint = dims_from_mapping({**hf, "torch_dtype": "bfloat16"})  # transformers 4's name
    assert (fp32_checkpoint.checkpoint_dtype, bf16_checkpoint.checkpoint_dtype) == ("fp32", "bf16")

    def weights(dims: ModelDims, dtype: str) -> int:
        return estimate(dims, Knobs(batch=1, cutoff_len=256, dtype=dtype), "sft", "mps").parts["weights"]

    assert weights(fp32_checkpoint, "bf16") == weights(QWEN25_05B, "fp32") == int(WEIGHT_FACTOR * 494_032_768 * 4)
    assert weights(bf16_checkpoint, "bf16") == weights(QWEN25_05B, "bf16") == int(WEIGHT_FACTOR * 494_032_768 * 2)
    assert weights(bf16_checkpoint, "fp32") == weights(QWEN25_05B, "bf16")  # narrower: as stored
    knobs = Knobs(batch=1, cutoff_len=256)
    assert activation_width(bf16_checkpoint, knobs) == 2 and activation_width(QWEN25_05B, knobs) == 4
    assert activation_width(fp32_checkpoint, replace(knobs, dtype="bf16")) == 2  # autocast


def test_on_cuda_a_checkpoint_stored_in_the_compute_dtype_costs_its_bytes():
    """CUDA's allocator counts tensors exactly and autocast keeps no cast copies of weights already in the
    compute dtype (bench/real.py on an H200); a float32 checkpoint under bf16 keeps the fitted factors, as
    do the CPU and MPS. Without gradients a GPU holds a chunk's float32 logits and their log-softmax, as the
    CPU does, whose held-out pass of a checkpoint computed as stored holds its tensors' own bytes beside a
    measured overhead."""
    bf16_checkpoint = replace(QWEN25_05B, checkpoint_dtype="bf16")
    knobs = Knobs(batch=2, cutoff_len=1024, dtype="bf16", lean_logits=True, eval_batch=2)
    cuda, mps = estimate(bf16_checkpoint, knobs, "sft", "cuda"), estimate(bf16_checkpoint, knobs, "sft", "mps")
    assert cuda.parts["weights"] == 494_032_768 * 2 and mps.parts["weights"] == int(WEIGHT_FACTOR * 494_032_768 * 2)
    assert cuda.parts["activations"] * ACTIVATION_FACTOR == pytest.approx(mps.parts["activations"], rel=1e-6)
    fp32_checkpoint = replace(QWEN25_05B, checkpoint_dtype="fp32")
    assert estimate(fp32_checkpoint, knobs, "sft", "cuda").parts["weights"] == int(WEIGHT_FACTOR * 494_032_768 * 4)
    one_row = replace(knobs, eval_batch=1)  # 1024 positions of 151,936 float32 logits fill a chunk
    cuda = estimate(bf16_checkpoint, one_row, "sft", "cuda")
    cpu = estimate(bf16_checkpoint, replace(one_row, dtype="fp32"), "sft", "cpu")  # computed as stored
    hidden_rows = 1024 * 896 * 2
    assert cuda.eval_parts["held-out logits"] == cpu.eval_parts["held-out logits"] == 2 * LEAN_CHUNK_BYTES + hidden_rows
    assert cpu.eval_parts["weights"] == 494_032_768 * 2 and cpu.eval_parts["overhead"] == EVAL_OVERHEAD_BYTES


def test_the_held_out_logits_are_counted_over_the_positions_the_batch_scores():
    """The lean path computes the logits of the answers' positions alone (the data's longest answer a
    sequence, token_lengths.py); every position where the data's lengths are unknown."""
    knobs = Knobs(batch=2, cutoff_len=1024, dtype="bf16", lean_logits=True, eval_batch=2)
    every = estimate(QWEN25_05B, knobs, "dpo", "cuda").eval_parts["held-out logits"]
    answers = estimate(QWEN25_05B, knobs, "dpo", "cuda", scored=50).eval_parts["held-out logits"]
    hidden_rows = 4 * 1024 * 896 * 2
    assert every == 2 * LEAN_CHUNK_BYTES + hidden_rows  # 4 x 1024 positions fill a chunk
    assert answers == 2 * 4 * 50 * 151_936 * 4 + hidden_rows
    assert estimate(QWEN25_05B, knobs, "dpo", "cuda", scored=5000).eval_parts["held-out logits"] == every


def test_dims_from_a_hugging_face_config_and_from_a_preset_agree():
    hf = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
          "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
          "model_type": "qwen2"}  # fmt: skip
    preset = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "ffn": 4864, "vocab": 151936,
              "model_type": "qwen2"}  # fmt: skip
    assert dims_from_mapping(hf) == dims_from_mapping(preset) == QWEN25_05B
    with pytest.raises(ValueError, match="ffn"):
        dims_from_mapping({"hidden": 8, "layers": 1, "heads": 1, "vocab": 10})


def test_saved_activation_elements_per_token_and_layer():
    knobs = Knobs(batch=1, cutoff_len=128, lora_rank=8)
    # 8h (norm inputs and outputs, q k v and attention output) + 4 ffn (SwiGLU) + 7r (LoRA)
    assert layer_activation_elements(TOY, knobs, True, GLIBC) == (8 * 64 + 4 * 256 + 7 * 8, 0)
    # eager attention keeps the float32 probabilities: heads x s per token
    assert layer_activation_elements(TOY, knobs, False, GLIBC) == (8 * 64 + 4 * 256 + 7 * 8, 4 * 128)


def test_a_16_bit_base_under_autocast_saves_a_16_bit_copy_of_each_lora_input():
    bf16 = replace(TOY, checkpoint_dtype="bf16")
    knobs = Knobs(batch=1, cutoff_len=128, lora_rank=8, dtype="bf16", checkpointing=False)
    counted = 8 * 64 + 4 * 256 + 7 * 8
    # peft casts q, k, v, o, gate and up's input to float32 and autocast casts it back: six hidden-wide copies
    assert layer_activation_elements(bf16, knobs, True, PROFILES[EXACT]) == (counted + 6 * 64, 0)
    # bitsandbytes' LoRA layers skip the cast under CUDA's autocast
    quantized = replace(knobs, quantization_bit=4)
    assert layer_activation_elements(bf16, quantized, True, PROFILES[EXACT]) == (counted, 0)
    # measured on the CPU too; MPS borrows the CPU's float32 factors, which cover them
    assert layer_activation_elements(bf16, knobs, True, GLIBC) == (counted + 6 * 64, 0)
    assert layer_activation_elements(bf16, knobs, True, PROFILES[UNMEASURED]) == (counted, 0)
    steps = {device: estimate(bf16, knobs, "sft", device).parts["activations"] for device in ("cuda", "cpu")}
    assert steps["cuda"] == TOY.layers * 128 * (counted + 6 * 64) * 2  # every layer's, at 16 bits


def test_a_16_bit_base_under_autocast_on_the_cpu_keeps_its_weights_as_the_file_s_pages():
    """Its weights cost their bytes, and the heap keeps its own share (AUTOCAST_HALF_HEAP_KEPT_FRACTION)."""
    bf16 = replace(QWEN25_05B, checkpoint_dtype="bf16")
    knobs = Knobs(batch=2, cutoff_len=256, dtype="bf16", checkpointing=True, lean_logits=True)
    under_autocast = estimate(bf16, knobs, "sft", "cpu").parts
    assert under_autocast["weights"] == int(bf16.params() * 2)
    share = AUTOCAST_HALF_HEAP_KEPT_FRACTION[True] * bf16.layers * layer_buffers(bf16, knobs, 512, MMAP_CEILING_BYTES)
    assert under_autocast["heap kept (glibc)"] == int(share)
    # computed as stored (no autocast), the weights keep the fitted per-parameter factor
    assert estimate(bf16, replace(knobs, dtype="fp32"), "sft", "cpu").parts["weights"] > bf16.params() * 2
    # quantized, nothing is a mapped file page: the heap is trimmed instead
    assert estimate(bf16, replace(knobs, quantization_bit=4), "sft", "cpu").parts["heap kept (glibc)"] < share


def test_a_quantized_base_computed_as_stored_keeps_one_layer_s_heap_whatever_its_depth():
    """The CPU trims the heap before each layer: what stays is one layer's recomputed forward and backward."""
    knobs = Knobs(batch=2, cutoff_len=256, lora_rank=8, dtype="fp32", quantization_bit=4, checkpointing=True)
    shallow = ModelDims(1024, 16, 16, 16, 4096, 1000, checkpoint_dtype="bf16", model_type="qwen2")
    kept = heap_kept(shallow, knobs, 512, GLIBC)
    assert kept == heap_kept(replace(shallow, layers=32), knobs, 512, GLIBC)
    # the layer's weights dequantized in float32: q, o, k, v 4 MiB each, gate, up, down 16 MiB each
    dequantized = (4 * 1024 * 1024 + 3 * 1024 * 4096) * 4
    buffers = layer_buffers(shallow, knobs, 512, MMAP_CEILING_BYTES)
    assert kept == int(TRIMMED_NATIVE_HALF_HEAP["layer buffers"] * buffers
                       + TRIMMED_NATIVE_HALF_HEAP["dequantized weights"] * dequantized)  # fmt: skip
    assert heap_kept(shallow, replace(knobs, checkpointing=False), 512, GLIBC) == 0
    # Qwen2.5-7B's weights dequantized: only k and v (7 MiB each) stay under the mmap ceiling; q and o
    # (49 MiB) and the MLP's (259 MiB) are mapped and unmapped on their own
    qwen7b = ModelDims(3584, 28, 28, 4, 18944, 152064, checkpoint_dtype="bf16", model_type="qwen2")
    assert heap_kept(qwen7b, knobs, 512, GLIBC) == int(
        TRIMMED_NATIVE_HALF_HEAP["layer buffers"] * layer_buffers(qwen7b, knobs, 512, MMAP_CEILING_BYTES)
        + TRIMMED_NATIVE_HALF_HEAP["dequantized weights"] * 2 * 3584 * 512 * 4)


def test_sft_estimate_part_by_part():
    knobs = Knobs(batch=2, cutoff_len=128, lora_rank=8, checkpointing=False, dtype="fp32", attention="sdpa",
                  lean_logits=False)
    parts = estimate(TOY, knobs, "sft", "cpu").parts
    tokens = 2 * 128
    lora = TOY.lora_params(8)
    assert parts["weights"] == int(WEIGHT_FACTOR * TOY.params() * 4)
    assert parts["lora weights"] == parts["gradients"] == int(WEIGHT_FACTOR * lora * 4)
    assert parts["optimizer (AdamW)"] == pytest.approx(2 * WEIGHT_FACTOR * lora * 4, abs=2)
    saved = 2 * tokens * (8 * 64 + 4 * 256 + 56) * 4  # two layers, float32
    assert parts["activations"] == pytest.approx(ACTIVATION_FACTOR * saved, abs=2)
    assert parts["logits (float32)"] == LOGIT_COPIES["sft"] * tokens * 1000 * 4
    assert parts["overhead"] == GLIBC_RUN_OVERHEAD_BYTES
    assert estimate(TOY, knobs, "sft", "cuda").parts["overhead"] == GPU_RUN_OVERHEAD_BYTES


def test_dpo_doubles_the_sequences_and_adds_the_reference_forward():
    knobs = Knobs(batch=2, cutoff_len=128, checkpointing=False, lean_logits=False)
    sft = estimate(QWEN25_05B, knobs, "sft", "cpu").parts
    dpo = estimate(QWEN25_05B, knobs, "dpo", "cpu").parts
    assert dpo["activations"] == pytest.approx(2 * sft["activations"], rel=1e-6)
    assert dpo["logits (float32)"] == 2 * 2 * 128 * 2 * 151936 * 4  # logits and log-softmax, 4 sequences
    assert dpo["reference forward"] == 3 * 2 * 128 * 2 * 151936 * 4  # its logits, a contiguous copy, log-softmax
    assert estimate(QWEN25_05B, knobs, "foodpo", "cpu").parts == dpo


def test_checkpointing_keeps_only_layer_inputs():
    on = estimate(QWEN25_05B, Knobs(batch=1, cutoff_len=512, checkpointing=True), "sft", "cpu")
    off = estimate(QWEN25_05B, Knobs(batch=1, cutoff_len=512, checkpointing=False), "sft", "cpu")
    assert on.parts["activations"] == int(ACTIVATION_FACTOR * 24 * 512 * 896 * 4)
    assert off.parts["activations"] > 10 * on.parts["activations"]
    assert on.training < off.training


def test_half_precision_halves_weights_and_activations():
    whole = Knobs(batch=1, cutoff_len=256, checkpointing=False, lean_logits=False)
    fp32 = estimate(QWEN25_05B, replace(whole, dtype="fp32"), "sft", "mps")
    bf16 = estimate(QWEN25_05B, replace(whole, dtype="bf16"), "sft", "mps")
    assert bf16.parts["weights"] * 2 == pytest.approx(fp32.parts["weights"], abs=2)
    assert bf16.parts["logits (float32)"] == fp32.parts["logits (float32)"]  # float32 either way
    assert bf16.parts["activations"] < fp32.parts["activations"]


def test_eager_attention_costs_the_quadratic_term_and_mps_sdpa_counts_as_eager():
    def knobs(attention: str) -> Knobs:
        return Knobs(batch=4, cutoff_len=1024, checkpointing=True, attention=attention, lean_attention=False)

    fused = estimate(TOY, knobs("sdpa"), "sft", "cpu")
    eager = estimate(TOY, knobs("eager"), "sft", "cpu")
    quadratic = 4 * 4 * 1024 * 1024 * 4  # batch x heads x s x s, float32
    assert eager.parts["layer backward"] >= ATTENTION_GRADIENT_COPIES * quadratic
    assert eager.training > fused.training + quadratic
    assert estimate(TOY, knobs("sdpa"), "sft", "mps").parts == estimate(TOY, knobs("eager"), "sft", "mps").parts


def test_lean_attention_costs_one_block_not_the_quadratic_term():
    """auto turns it on where attention would be materialised (MPS, eager) and leaves fused SDPA alone."""
    knobs = Knobs(batch=4, cutoff_len=4096, checkpointing=True, dtype="bf16", lean_logits=True)
    assert not lean_attention_runs(knobs, "cpu", TOY) and not lean_attention_runs(knobs, "cuda", TOY)
    assert lean_attention_runs(knobs, "mps", TOY) and lean_attention_runs(replace(knobs, attention="eager"), "cpu", TOY)
    assert not lean_attention_runs(replace(knobs, lean_attention=False), "mps", TOY)
    float32 = replace(QWEN25_05B, checkpoint_dtype="fp32")  # under autocast: the same factors on MPS and the CPU
    math = estimate(float32, replace(knobs, lean_attention=False), "sft", "mps")
    lean = estimate(float32, knobs, "sft", "mps")
    fused = estimate(float32, knobs, "sft", "cpu")  # fused SDPA
    quadratic = 4 * 14 * 4096 * 4096 * 4  # batch x heads x s x s, float32
    # one layer's backward: a few blocks of scores instead of the probabilities and their gradients
    assert math.parts["layer backward"] - lean.parts["layer backward"] > ATTENTION_GRADIENT_COPIES * quadratic
    blocks = LEAN_ATTENTION_BLOCK_COPIES * attention_block_bytes("mps")
    assert 0 < lean.parts["layer backward"] - fused.parts["layer backward"] <= blocks
    # each layer saves q, k, v unrepeated (GQA: 2 of 14 heads) and a log-sum-exp: less than SDPA's q, k, v
    no_checkpointing = replace(knobs, checkpointing=False)
    assert estimate(float32, no_checkpointing, "sft", "mps").parts["activations"] < (
        estimate(float32, no_checkpointing, "sft", "cpu").parts["activations"]
    )


def test_the_cpus_heap_sits_under_either_peak_with_and_without_checkpointing():
    """glibc keeps freed layer buffers below 32 MiB; MPS and CUDA have caching allocators instead."""
    knobs = Knobs(batch=1, cutoff_len=2048, checkpointing=True, lean_logits=True, lean_attention=True)
    checkpointed = estimate(QWEN25_05B, knobs, "sft", "cpu")
    assert "layer backward" in checkpointed.parts  # the peak in a layer's backward, not at the logits
    assert checkpointed.parts["heap kept (glibc)"] == heap_kept(QWEN25_05B, knobs, 2048, GLIBC) > 0
    unchecked = estimate(QWEN25_05B, replace(knobs, checkpointing=False), "sft", "cpu")
    assert 0 < unchecked.parts["heap kept (glibc)"] < checkpointed.parts["heap kept (glibc)"]
    assert "heap kept (glibc)" not in estimate(QWEN25_05B, knobs, "sft", "mps").parts
    # at 16384 positions every layer buffer is 32 MiB or more: glibc maps and unmaps each on its own
    assert "heap kept (glibc)" not in estimate(QWEN25_05B, replace(knobs, cutoff_len=16384), "sft", "cpu").parts


def test_a_qwen_run_costs_gigabytes_not_megabytes():
    result = estimate(QWEN25_05B, Knobs(batch=4, cutoff_len=512, checkpointing=False), "dpo", "cpu")
    assert 5 * GB < result.training < 60 * GB
    assert result.total == result.training + result.framework + result.libraries


def test_qlora_4bit_quantizes_only_the_decoder_linear_layers():
    knobs = Knobs(batch=1, cutoff_len=256, dtype="bf16")
    plain = estimate(QWEN25_05B, knobs, "sft", "cuda").parts["weights"]
    qlora = estimate(QWEN25_05B, replace(knobs, quantization_bit=4), "sft", "cuda").parts["weights"]
    linear = 24 * (14_912_384 - 2 * 896 - 896 - 2 * 128)  # every decoder weight but the norms and q/k/v biases
    expected = linear * 0.516 + (494_032_768 - linear) * 2  # embeddings (151936 x 896) stay bf16
    assert qlora == pytest.approx(expected, rel=1e-6)  # CUDA, stored in the compute dtype: its bytes
    assert qlora < 0.5 * plain


def test_a_quantized_base_peaks_while_loading_where_the_step_holds_less():
    qwen25_7b = ModelDims(hidden=3584, layers=28, heads=28, kv_heads=4, ffn=18944, vocab=152064,
                          tied_embeddings=False, model_type="qwen2")  # fmt: skip
    knobs = Knobs(batch=1, cutoff_len=16, lora_rank=8, dtype="bf16", quantization_bit=4)
    short = estimate(qwen25_7b, knobs, "sft", "mps")
    transients = LOADING_COPIES[4] * 3584 * 18944 * 4  # float32 copies of gate, up or down (hidden x ffn)
    assert short.loading == short.parts["weights"] + short.parts["lora weights"] + transients
    assert short.loading > short.step and short.training == short.loading  # 16 tokens hold next to nothing
    long = estimate(qwen25_7b, replace(knobs, cutoff_len=4096), "sft", "mps")
    assert long.loading == short.loading and long.training == long.step > long.loading
    assert estimate(qwen25_7b, replace(knobs, quantization_bit=None), "sft", "mps").loading == 0
    on_cuda = estimate(qwen25_7b, knobs, "sft", "cuda")  # quantized on the GPU as each weight arrives
    assert on_cuda.loading == on_cuda.parts["weights"] + on_cuda.parts["lora weights"]


def test_8bit_optimizer_and_zero_sharding_per_process():
    full = Knobs(batch=1, cutoff_len=256, dtype="bf16", finetuning="full")
    alone = estimate(QWEN25_05B, full, "sft", "cuda").parts
    assert alone["optimizer (AdamW)"] == pytest.approx(494_032_768 * 8, rel=1e-6)
    eight_bit = estimate(QWEN25_05B, replace(full, optim="paged_adamw_8bit"), "sft", "cuda").parts
    assert eight_bit["optimizer (AdamW)"] == pytest.approx(alone["optimizer (AdamW)"] / 4, rel=1e-6)
    zero2 = estimate(QWEN25_05B, replace(full, zero_stage=2, world_size=8), "sft", "cuda").parts
    zero3 = estimate(QWEN25_05B, replace(full, zero_stage=3, world_size=8), "sft", "cuda").parts
    assert zero2["weights"] == alone["weights"] and zero2["gradients"] == pytest.approx(alone["gradients"] / 8, abs=1)
    assert zero3["weights"] == pytest.approx(alone["weights"] / 8, abs=1)
    assert zero3["activations"] == alone["activations"]  # each process keeps its own batch's activations


def test_lean_paths_are_counted_only_on_the_models_the_engine_runs_them_for():
    from mpskit.engine import lean_attention, lean_logits

    assert lean_logits.LEAN_MODEL_TYPES is lean_attention.LEAN_MODEL_TYPES  # the memory model's own table
    phi3 = replace(QWEN25_05B, model_type="phi3")
    lean = Knobs(batch=1, cutoff_len=4096, dtype="bf16", lean_logits=True, lean_attention=True)
    whole = replace(lean, lean_logits=False, lean_attention=False)
    assert estimate(phi3, lean, "dpo", "mps").parts == estimate(phi3, whole, "dpo", "mps").parts
    assert estimate(QWEN25_05B, lean, "dpo", "mps").training < estimate(phi3, lean, "dpo", "mps").training / 5
    assert not lean_attention_runs(replace(lean, lean_attention=None), "mps", phi3)


def test_parameter_counts_read_as_people_write_them():
    from mpskit.plan.memory import parameters_text

    assert [parameters_text(n) for n in (198_656, 494_032_768, 7_615_616_512)] == ["198,656", "494M", "7.62B"]
