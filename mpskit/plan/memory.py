"""Peak training memory, estimated before anything loads. Pure Python: no torch import.

The estimate is a breakdown in bytes of what one optimizer step holds at its peak: frozen weights,
LoRA weights with their gradients and AdamW states, the activations autograd saves per decoder
layer, the float32 logits and log-softmax over the vocabulary (large for Qwen's 151,936 tokens), the
reference forward of DPO/fooDPO, and a fixed overhead. It counts what a decoder layer of the model
types in LEAN_MODEL_TYPES saves for backward in transformers 5 with peft LoRA: the same on any device.

What an allocator adds to those bytes (factors, the heap glibc keeps, a fixed cost) is its profile's,
in allocators.py: this module never asks which device or allocator it plans for, except where a
kernel differs (SDPA's math path on MPS, lean attention's block size).

`training` is the memory the run adds on top of an imported framework; `framework` is that import
footprint (torch, transformers, LLaMA-Factory), which counts against RAM but not against a GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from mpskit.plan.allocators import Allocation, Allocator, usual_allocator
from mpskit.settings.knobs import Knobs
from mpskit.stages import stage_of

GB = 1024**3
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CHECKPOINT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # config.json's names

# RSS of a process that has imported torch, transformers, peft, trl and LLaMA-Factory (0.89 GB in
# every bench case, Linux, torch 2.14); it counts against RAM, not against a GPU.
FRAMEWORK_BYTES = int(0.9 * GB)
# The libraries' code a run first uses after the imports (the backward's and the optimizer's kernels):
# resident pages of their .so files, which RSS counts and the run's own figures leave out (monitor.py).
# Measured at each run's peak (Measured.libraries_gb): in the development venv 0.024 GB for the tiny
# model, 0.026-0.029 GB for 85M-weight 16-bit and 4-bit bases; in CI's freshly installed clone 0.046 GB
# for the tiny model (a fresh venv maps more of each library: docs/runs-and-recovery.md). Like the
# imports, RAM, outside a GPU's budget.
LIBRARY_PAGES_BYTES = int(0.05 * GB)
# Vocabulary-sized float32 buffers alive at the step's peak. SFT (transformers' loss): in the backward
# through the log-softmax, its saved output, the incoming gradient and the outgoing one (3). DPO
# (LLaMA-Factory's get_batch_logps takes the log-softmax of the view logits[:, :-1], which makes a
# contiguous copy first): during the reference forward the policy's logits and saved log-softmax
# (2) plus the reference's logits, copy and log-softmax (3).
LOGIT_COPIES = {"sft": 3, "dpo": 5}
# LoRA layers whose input is hidden-wide: q, k, v (each casts the same input again), o, gate, up.
# peft casts a 16-bit base's LoRA input to the adapter's float32 in every dtype: without autocast lora_A
# saves that float32 copy; under autocast, autocast casts it back to 16 bits for lora_A, which saves the
# 16-bit copy (the ffn-wide one of down_proj takes the place of the MLP's product, which nothing else
# saves). bitsandbytes' LoRA layers skip the cast where CUDA's autocast is on (torch.is_autocast_enabled()
# asks CUDA's), so a quantized base on CUDA makes none. On an H200 (bench/real.py --hardware detect) the
# 16-bit steps without checkpointing read 9-18% under the plan that left these out, and within 1.2% with them.
LORA_INPUT_COPIES = 6
# Transient buffers in one layer's backward: gradients of the MLP's ffn-wide tensors, and with eager
# attention the float32 heads x s x s gradients of the probabilities and of the scores.
MLP_GRADIENT_COPIES = 2
ATTENTION_GRADIENT_COPIES = 2
# The lean path (lean_logits.py) holds one chunk of float32 logits (128 MiB) with its softmax and the
# matmul's output, and per scored position two hidden-sized rows: the gathered hidden state and its
# gradient; in the backward, the hidden gradient scattered back to every position.
LEAN_CHUNK_BYTES = 128 * 1024**2
LEAN_CHUNK_COPIES = 2
# With quantize_embeddings the output layer is dequantized a chunk of its rows at a time, each chunk
# under this size (engine/quantized_vocab.py); the lean path holds one, and the float32 logits of every
# position against those rows, worked on in place, beside the 16-bit product they come from or the
# 16-bit copy the gradient's matmul takes: PACKED_CHUNK_COPIES, counted (on glibc the heap is trimmed
# after each chunk, engine/lean_logits.py, so that is what stays, in training and evaluation).
# Packing a table as it loads works 4 MiB of its rows at a time: bitsandbytes' CPU quantizer holds
# several times its input while it works (1.9 GB for a whole 151,936 x 896 bf16 table; a chunk at a
# time, 85 MB above the packed table). Beside the 16-bit table the loader hands over, loading then
# holds PACKING_BYTES more: fitted to bench/packed_vocab.py's loading peaks (one shape, the CPU; not
# held out).
DEQUANTIZED_ROWS_BYTES = 32 * 1024**2
PACKING_ROWS_BYTES = 4 * 1024**2
PACKING_BYTES = 144 * 1024**2
PACKED_CHUNK_COPIES = 2
PACK_BLOCK = 64
LEAN_HIDDEN_COPIES = 3
# Lean attention (lean_attention.py) holds one block of float32 scores at a time. On the CPU small
# blocks are fastest (bench/lean_attention.py); on a GPU larger ones mean fewer kernel launches.
LEAN_ATTENTION_BLOCK_BYTES = {"cpu": 8 * 1024**2, "gpu": 64 * 1024**2}
# In its backward a block's probabilities and the gradient of its scores, with their 16-bit copies.
LEAN_ATTENTION_BLOCK_COPIES = 3


# The model types whose output layer and attention the lean paths replace: the engine's lean_logits.py
# and lean_attention.py check this table, so a plan counts a lean path only where it will run (any
# other model trains with whole logits and its own attention, and is planned so; a preset without
# model_type too).
LEAN_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")

# The held-out pass (no gradients), per token of the eval batch: one decoder layer's forward holds its
# input and output, q/k/v and the attention output, and the MLP's gate, up and their product.
EVAL_LAYER_COPIES = {"hidden": 6, "ffn": 3}
EVAL_LOGIT_COPIES = {"sft": 3, "dpo": 4}
# Without gradients a chunk's float32 logits and their log-softmax are alive at once (bench/real.py: a
# GPU's allocator counts both; on the CPU, where the lean path hands the heap back around each held-out
# forward, engine/lean_logits.py, the pass measures the same two over its trimmed start).
EVAL_LEAN_CHUNK_COPIES = 2
# Bytes per quantized weight, measured on bitsandbytes 0.50.2's tensors (Qwen2.5-7B's layer shapes):
# NF4 packs two weights a byte plus a block constant per 64 weights, itself 8-bit with a float32
# constant per 256 blocks (double quantization): 0.516. int8 keeps a float32 scale per row: 1.001.
QUANTIZED_BYTES = {4: 0.516, 8: 1.001}
# A quantized layer's matmul dequantizes its weight to the compute dtype first, in the forward and
# again in the backward (the gradient of its input): one such copy of the largest weight is alive.
DEQUANTIZED_COPIES = 1
@dataclass(frozen=True)
class ModelDims:
    """The shapes that decide memory. `vocab` is the embedding size, not the tokenizer's length."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool = True
    # The checkpoint's own dtype (config.json), where known: LLaMA-Factory loads the weights with
    # torch_dtype="auto", so a float32 checkpoint keeps float32 weights under a bf16 plan (autocast).
    checkpoint_dtype: str | None = None
    model_type: str | None = None  # config.json's (or the preset's): whether the lean paths run

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """q/k/v with bias (Qwen2), o, gate/up/down, two RMSNorm weights."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        return (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * f + 2 * h

    def linear_weight_sizes(self) -> list[int]:
        """The weights of each of a layer's seven linear layers (q, o, k, v, gate, up, down)."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        return [h * h] * 2 + [h * kv] * 2 + [h * f] * 3

    def layer_linear_weights(self) -> int:
        """The weights of a layer's seven linear layers, what bitsandbytes quantizes (biases stay)."""
        return sum(self.linear_weight_sizes())

    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params() + embeddings + self.hidden

    def lora_params(self, rank: int) -> int:
        """LoRA on all seven linear layers (lora_target: all): rank x (in + out) each."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + f) + (f + h)
        return self.layers * rank * per_layer


def parameters_text(count: int) -> str:
    """A parameter count as people write it: 1.54B, 494M, and exact under a million (the tiny model)."""
    if count >= 1e9:
        return f"{count / 1e9:.2f}B"
    return f"{count / 1e6:.0f}M" if count >= 1e6 else f"{count:,}"


def dims_from_mapping(data: dict) -> ModelDims:
    """From a preset's `dims:` (hidden, layers, ...) or a Hugging Face config.json (hidden_size, ...)."""
    hf = {
        "hidden_size": "hidden",
        "num_hidden_layers": "layers",
        "num_attention_heads": "heads",
        "num_key_value_heads": "kv_heads",
        "intermediate_size": "ffn",
        "vocab_size": "vocab",
        "tie_word_embeddings": "tied_embeddings",
    }
    values = {hf.get(key, key): value for key, value in data.items()}
    values.setdefault("kv_heads", values.get("heads"))
    names = ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab")
    missing = [name for name in names if name not in values]
    if missing:
        raise ValueError(f"model dims lack {', '.join(missing)}")
    said = {name: key for key, name in hf.items() if key in data}  # the name the mapping itself uses
    for name in names:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{said.get(name, name)} is {json.dumps(value)}, not a whole number above 0")
    checkpoint_dtype = CHECKPOINT_DTYPES.get(str(data.get("dtype") or data.get("torch_dtype")))
    return ModelDims(*(values[name] for name in names), tied_embeddings=bool(values.get("tied_embeddings", True)),
                     checkpoint_dtype=checkpoint_dtype, model_type=data.get("model_type"))  # fmt: skip


def attention_block_bytes(device: str) -> int:
    """The byte budget of one block of lean attention's float32 scores on this device (its speed)."""
    return LEAN_ATTENTION_BLOCK_BYTES["cpu" if device == "cpu" else "gpu"]


def lean_logits_apply(knobs: Knobs, stage: str, dims: ModelDims) -> bool:
    """The lean path runs for the lean stages (stages.py) with a frozen output layer (LoRA), on the
    models it knows (LEAN_MODEL_TYPES)."""
    lean = knobs.lean_logits and stage_of(stage).lean and knobs.finetuning == "lora"
    return lean and dims.model_type in LEAN_MODEL_TYPES


@dataclass
class Estimate:
    parts: dict[str, int] = field(default_factory=dict)  # name -> bytes, in the order they build up
    framework: int = 0  # RSS of the imports
    libraries: int = 0  # the libraries' pages the run first uses after them (LIBRARY_PAGES_BYTES)
    loading: int = 0  # the peak while a quantized base loads (0: below the step's)
    eval_parts: dict[str, int] = field(default_factory=dict)  # the held-out pass's peak; empty: none runs

    @property
    def step(self) -> int:
        return sum(self.parts.values())

    @property
    def evaluation(self) -> int:
        return sum(self.eval_parts.values())

    @property
    def training(self) -> int:
        """The run's peak: one training step's, or loading's or the held-out pass's where higher."""
        return max(self.step, self.loading, self.evaluation)

    @property
    def peak_moment(self) -> str:
        """Which moment the run's peak is."""
        moments = {"a training step": self.step, "loading": self.loading, "the held-out evaluation": self.evaluation}
        return max(moments, key=moments.__getitem__)

    @property
    def total(self) -> int:
        """The whole process at its peak, as GNU time or a scheduler reads its RSS."""
        return self.training + self.framework + self.libraries

    def as_dict(self) -> dict:
        return {
            "parts_gb": {name: round(value / GB, 3) for name, value in self.parts.items()},
            "loading_gb": round(self.loading / GB, 3),
            "step_gb": round(self.step / GB, 3),
            "eval_parts_gb": {name: round(value / GB, 3) for name, value in self.eval_parts.items()},
            "evaluation_gb": round(self.evaluation / GB, 3),
            "training_gb": round(self.training / GB, 3),
            "framework_gb": round(self.framework / GB, 3),
            "libraries_gb": round(self.libraries / GB, 3),
        }


def sequences_per_step(stage: str, batch: int) -> int:
    """Preference stages run chosen and rejected answers of each pair as one concatenated batch."""
    return 2 * batch if stage_of(stage).pairs else batch


def attention_fused(attention: str, device: str) -> bool:
    """Whether the b x heads x s x s probabilities are never saved (MPS runs SDPA as its math path)."""
    return attention == "fa2" or (attention == "sdpa" and device in ("cpu", "cuda"))


def lean_attention_runs(knobs: Knobs, device: str, dims: ModelDims) -> bool:
    """Lean attention as asked; `auto` (None): wherever the attention would otherwise be materialised.
    Never on a model it does not know (LEAN_MODEL_TYPES)."""
    if dims.model_type not in LEAN_MODEL_TYPES:
        return False
    return not attention_fused(knobs.attention, device) if knobs.lean_attention is None else knobs.lean_attention


def weight_width(dims: ModelDims, knobs: Knobs) -> int:
    """Bytes per frozen weight. LLaMA-Factory 0.9.5 loads every model with torch_dtype="auto" on every
    device, so the weights keep the checkpoint's dtype whatever the run computes in (measured: a float32
    checkpoint under bf16 holds float32 weights on CUDA; a bf16 one under float32 holds bf16 on the
    CPU). The plan's dtype where the checkpoint's is unknown."""
    return DTYPE_BYTES.get(dims.checkpoint_dtype, DTYPE_BYTES[knobs.dtype])


def activation_width(dims: ModelDims, knobs: Knobs) -> int:
    """Bytes per activation: 16 bits under autocast (bf16/fp16), else the weights' own: without
    autocast, a bf16 checkpoint's hidden states are bf16 (LoRA computes in float32 and hands back the
    layer's dtype; a quantized layer computes in float32 and returns its input's dtype)."""
    return DTYPE_BYTES[knobs.dtype] if knobs.dtype != "fp32" else weight_width(dims, knobs)


def weight_bytes(dims: ModelDims, knobs: Knobs) -> float:
    """Base weights: bitsandbytes quantizes the decoder's linear layers (QUANTIZED_BYTES per weight);
    embeddings, the output layer, norms and biases keep their width (weight_width), except that
    quantize_embeddings packs the embeddings and the output layer (one copy where tied; packed_bytes)."""
    width = weight_width(dims, knobs)
    if knobs.quantization_bit is None:
        return dims.params() * width
    linear = dims.layers * dims.layer_linear_weights()
    packed = vocab_weights(dims) if knobs.quantize_embeddings else 0
    rest = dims.params() - linear - packed
    return linear * QUANTIZED_BYTES[knobs.quantization_bit] + packed * packed_bytes(dims, knobs) + rest * width


def vocab_weights(dims: ModelDims) -> int:
    """The input embeddings' and the output layer's weights (one table where they are tied)."""
    return dims.vocab * dims.hidden * (1 if dims.tied_embeddings else 2)


def packed_bytes(dims: ModelDims, knobs: Knobs) -> float:
    """Bytes per weight of a packed embedding or output layer (engine/quantized_vocab.py): 4 bits with
    a float32 scale per PACK_BLOCK weights, or int8 with a float32 scale per row (counted, not fitted:
    a packed table is its tensors)."""
    if knobs.quantization_bit == 4:
        return 0.5 + 4 / PACK_BLOCK
    return 1 + 4 / dims.hidden


def dequantized_rows(dims: ModelDims, knobs: Knobs) -> int:
    """What the lean path holds beside its logits for a packed output layer: one chunk of its rows
    dequantized."""
    if not knobs.quantize_embeddings:
        return 0
    return min(DEQUANTIZED_ROWS_BYTES, dims.vocab * dims.hidden * weight_width(dims, knobs))


def optimizer_bytes_per_parameter(optim: str) -> int:
    """AdamW's two moments: float32 (8 bytes) or bitsandbytes' 8-bit states (2 bytes)."""
    return 2 if "8bit" in optim else 8


def trainable_params(dims: ModelDims, knobs: Knobs) -> int:
    return dims.lora_params(knobs.lora_rank) if knobs.finetuning == "lora" else dims.params()


def checkpoint_bytes(dims: ModelDims, knobs: Knobs) -> int:
    """One checkpoint on disk: the trainable weights (float32) and the optimizer's states."""
    return trainable_params(dims, knobs) * (4 + optimizer_bytes_per_parameter(knobs.optim))


def layer_activation_elements(dims: ModelDims, knobs: Knobs, fused: bool, allocator: Allocator,
                              lean: bool = False) -> tuple[int, int]:  # fmt: skip
    """(16/32-bit elements, float32 elements) one decoder layer saves for backward, per token.

    Counted for transformers 5's Qwen2 layer with peft LoRA and frozen base weights:
    two RMSNorms save their input and output (4h), SDPA saves q, k, v (k and v repeated to all heads
    when a padding mask is present) and its output (4h), the SwiGLU MLP saves gate, SiLU(gate), up
    and their product (4 ffn), each LoRA adapter its rank-r projection (7r). Eager attention adds
    the softmax probabilities in float32 (heads x s per token), plus a copy in the compute dtype.
    Lean attention saves q, its output, k and v unrepeated, and a float32 log-sum-exp per head.
    A 16-bit checkpoint trained without autocast adds a float32 copy of each LoRA layer's input, which
    peft casts to the adapter's float32 and lora_A keeps (LORA_INPUT_COPIES hidden-wide, one ffn-wide);
    under autocast a 16-bit base's LoRA layers save 16-bit copies of their hidden-wide inputs, counted
    where the allocator's profile was measured so (elsewhere its borrowed factors cover them).
    """
    attention = 2 * dims.hidden + 2 * dims.kv_dim if lean else 4 * dims.hidden
    elements = 4 * dims.hidden + attention + 4 * dims.ffn + 7 * knobs.lora_rank
    fp32_elements = dims.heads if lean else 0
    if knobs.finetuning == "lora" and native_half(dims, knobs):
        fp32_elements += LORA_INPUT_COPIES * dims.hidden + dims.ffn
    if knobs.finetuning == "lora" and allocator.counts_autocast_lora_copies and autocast_half(dims, knobs):
        elements += LORA_INPUT_COPIES * dims.hidden
    if not fused and not lean:
        probabilities = dims.heads * knobs.cutoff_len
        fp32_elements += probabilities
        if activation_width(dims, knobs) != 4:
            elements += probabilities
    return elements, fp32_elements


def native_half(dims: ModelDims, knobs: Knobs) -> bool:
    """A 16-bit checkpoint trained in its own dtype, without autocast."""
    return knobs.dtype == "fp32" and weight_width(dims, knobs) == 2


def autocast_half(dims: ModelDims, knobs: Knobs) -> bool:
    """A 16-bit checkpoint, unquantized, computed under autocast in its own dtype."""
    return (knobs.dtype != "fp32" and knobs.quantization_bit is None
            and weight_width(dims, knobs) == DTYPE_BYTES[knobs.dtype])  # fmt: skip


def allocation(dims: ModelDims, knobs: Knobs) -> Allocation:
    """What about the run decides how an allocator holds its tensors (allocators.py)."""
    return Allocation(quantized=knobs.quantization_bit is not None, checkpointing=knobs.checkpointing,
                      native_half=native_half(dims, knobs), autocast_half=autocast_half(dims, knobs),
                      stored_as_computed=weight_width(dims, knobs) == DTYPE_BYTES[knobs.dtype])  # fmt: skip


def layer_buffers(dims: ModelDims, knobs: Knobs, tokens: int, ceiling: int) -> int:
    """One decoder layer's buffers under `ceiling` (a heap's largest mmap threshold): those a heap keeps
    pages of."""
    width = activation_width(dims, knobs)
    buffers = [tokens * dims.hidden * width] * 8 + [tokens * dims.ffn * width] * 4
    return sum(size for size in buffers if size < ceiling)


def heap_kept(dims: ModelDims, knobs: Knobs, tokens: int, allocator: Allocator) -> int:
    """What the allocator's heap keeps of earlier steps' freed layer buffers (allocators.GlibcHeap); 0
    where its profile has no heap terms."""
    heap = allocator.heap
    if heap is None:
        return 0
    width = dequantized_width(knobs)
    dequantized = sum(size * width for size in dims.linear_weight_sizes() if size * width < heap.mmap_ceiling)
    run = allocation(dims, knobs)
    return heap.kept(run, allocator.trimmed(run), dims.layers, layer_buffers(dims, knobs, tokens, heap.mmap_ceiling),
                     dequantized)  # fmt: skip


def estimate(dims: ModelDims, knobs: Knobs, stage: str = "sft", device: str = "cpu", longest: int | None = None,
             scored: int | None = None, allocator: Allocator | None = None) -> Estimate:  # fmt: skip
    """What is alive at the peak of one training step, part by part, for batches of cutoff_len tokens,
    or of `longest` where the data makes no longer batch (token_lengths.py).

    The peak is at one of two moments: where the vocabulary-sized float32 buffers live (SFT's
    backward through the log-softmax; DPO's reference forward while the policy's logits are held;
    the lean path's chunks), or in the backward of one decoder layer (recomputed activations with
    checkpointing, and the gradients of the attention probabilities with eager attention). The
    larger one is reported; both sit above the heap earlier steps left, where the allocator keeps one.
    `allocator`: the profile machine/ chose (Hardware.allocator); by default the device's usual one.
    """
    allocator = allocator or usual_allocator(device)
    if longest is not None and longest < knobs.cutoff_len:
        knobs = replace(knobs, cutoff_len=longest)
    width = activation_width(dims, knobs)
    sequences = sequences_per_step(stage, knobs.batch)
    tokens = sequences * knobs.cutoff_len
    # ZeRO-2 splits gradients and optimizer states over the processes, ZeRO-3 the weights as well.
    shard_states = knobs.world_size if knobs.zero_stage >= 2 else 1
    shard_weights = knobs.world_size if knobs.zero_stage >= 3 else 1
    run = allocation(dims, knobs)
    per_weight = allocator.weight_factor(run)
    frozen = allocator.frozen_weight_factor(run)
    parts: dict[str, int] = {"weights": int(frozen * weight_bytes(dims, knobs) / shard_weights)}

    trainable = trainable_params(dims, knobs)
    # Trainable parameters are kept in float32 (LLaMA-Factory upcasts them).
    per_parameter = per_weight * trainable
    if knobs.finetuning == "lora":
        parts["lora weights"] = int(per_parameter * 4 / shard_weights)
    parts["gradients"] = int(per_parameter * 4 / shard_states)
    parts["optimizer (AdamW)"] = int(per_parameter * optimizer_bytes_per_parameter(knobs.optim) / shard_states)

    fused = attention_fused(knobs.attention, device)
    lean_attention = lean_attention_runs(knobs, device, dims)
    elements, fp32_elements = layer_activation_elements(dims, knobs, fused, allocator, lean_attention)
    factor = allocator.activation_factor(run)
    layer_bytes = int(factor * tokens * (elements * width + fp32_elements * 4))
    if knobs.checkpointing:  # each layer keeps only its input
        parts["activations"] = int(factor * dims.layers * tokens * dims.hidden * width)
    else:
        parts["activations"] = dims.layers * layer_bytes

    logit_buffer = tokens * dims.vocab * 4
    if lean_logits_apply(knobs, stage, dims):
        hidden_rows = LEAN_HIDDEN_COPIES * tokens * dims.hidden * width
        positions = scored_tokens(knobs, sequences, scored)
        logit_parts = {"lean logits": lean_chunks(dims, knobs, positions, LEAN_CHUNK_COPIES) + hidden_rows}
    elif stage_of(stage).reference_model:
        logit_parts = {
            "logits (float32)": 2 * logit_buffer,
            "reference forward": (LOGIT_COPIES["dpo"] - 2) * logit_buffer,
        }
    else:
        logit_parts = {"logits (float32)": LOGIT_COPIES["sft"] * logit_buffer}
    workspace = tokens * dims.ffn * width * MLP_GRADIENT_COPIES
    scores = sequences * dims.heads * knobs.cutoff_len**2 * 4  # one layer's float32 attention scores
    if lean_attention:
        workspace += LEAN_ATTENTION_BLOCK_COPIES * min(attention_block_bytes(device), scores)
    elif not fused:
        workspace += scores * ATTENTION_GRADIENT_COPIES
    if knobs.checkpointing:
        workspace += layer_bytes
    if knobs.quantization_bit:
        workspace += dequantized_bytes(dims, knobs)
    if sum(logit_parts.values()) >= workspace:
        parts.update(logit_parts)
    else:
        parts["layer backward"] = workspace
    kept = heap_kept(dims, knobs, tokens, allocator)
    if kept:
        parts["heap kept (glibc)"] = kept
    parts["overhead"] = allocator.run_overhead
    return Estimate(parts=parts, framework=FRAMEWORK_BYTES, libraries=LIBRARY_PAGES_BYTES,
                    loading=loading_peak(dims, knobs, parts, allocator),
                    eval_parts=evaluation_parts(dims, knobs, stage, device, parts, scored, allocator))  # fmt: skip


def scored_tokens(knobs: Knobs, sequences: int, scored: int | None) -> int:
    """The positions whose logits the lean path computes: `scored` a sequence (the data's longest answer
    under cutoff_len, token_lengths.py), or every position where that is unknown."""
    return sequences * (knobs.cutoff_len if scored is None else min(scored, knobs.cutoff_len))


def lean_chunks(dims: ModelDims, knobs: Knobs, positions: int, copies: int) -> int:
    """The lean path's chunks of float32 logits over the scored `positions` (scored_tokens): `copies` of
    at most LEAN_CHUNK_BYTES over the whole vocabulary, or for a packed output layer,
    PACKED_CHUNK_COPIES of every such position against one chunk of its rows, with those rows dequantized."""
    rows = dequantized_rows(dims, knobs)
    if not rows:
        return copies * min(LEAN_CHUNK_BYTES, positions * dims.vocab * 4)
    chunk_rows = rows // (dims.hidden * weight_width(dims, knobs))
    return PACKED_CHUNK_COPIES * min(LEAN_CHUNK_BYTES, positions * chunk_rows * 4) + rows


def dequantized_width(knobs: Knobs) -> int:
    """Bytes per weight a quantized layer dequantizes for its matmul: the compute dtype's (bitsandbytes'
    compute_dtype is LLaMA-Factory's, float32 unless bf16/fp16)."""
    return DTYPE_BYTES[knobs.dtype]


def dequantized_bytes(dims: ModelDims, knobs: Knobs) -> int:
    """A quantized layer's weight dequantized for its matmul, one copy of the largest weight."""
    return DEQUANTIZED_COPIES * dims.hidden * dims.ffn * dequantized_width(knobs)


def evaluation_parts(dims: ModelDims, knobs: Knobs, stage: str, device: str, parts: dict[str, int],
                     scored: int | None = None, allocator: Allocator | None = None) -> dict[str, int]:  # fmt: skip
    """What is alive at the peak of one held-out batch (knobs.eval_batch; none: no evaluation), after
    training steps: the weights and the optimizer's states stay (gradients are freed after each step);
    nothing is saved for backward, so the peak is one decoder layer's forward (EVAL_LAYER_COPIES) or
    the logits: the lean chunks over the positions the batch scores (`scored` a sequence where the
    data's lengths are known, else every position), or whole float32 logits (SFT's loss: the logits,
    their float32 copy and log-softmax; DPO: the policy's logits, kept for its metrics, beside the
    reference forward's three). Where the run trims a heap it is handed back before an evaluation
    (run/monitor.py) and around each of its lean forwards (engine/lean_logits.py), so the layers' freed
    buffers are not under the logits."""
    if knobs.eval_batch is None:
        return {}
    allocator = allocator or usual_allocator(device)
    width = activation_width(dims, knobs)
    sequences = sequences_per_step(stage, knobs.eval_batch)
    tokens = sequences * knobs.cutoff_len
    held = _held_through_evaluation(dims, knobs, allocator, parts)
    layer = tokens * (EVAL_LAYER_COPIES["hidden"] * dims.hidden + EVAL_LAYER_COPIES["ffn"] * dims.ffn) * width
    scores = sequences * dims.heads * knobs.cutoff_len**2 * 4
    if lean_attention_runs(knobs, device, dims):
        layer += min(attention_block_bytes(device), scores)
    elif not attention_fused(knobs.attention, device):
        layer += 2 * scores  # the float32 scores and their softmax
    if knobs.quantization_bit:
        layer += dequantized_bytes(dims, knobs)
    if allocator.heap and native_half(dims, knobs):
        layer += int(allocator.heap.eval_layer_heap * layer_buffers(dims, knobs, tokens, allocator.heap.mmap_ceiling))
    if lean_logits_apply(knobs, stage, dims):
        positions = scored_tokens(knobs, sequences, scored)
        logits = lean_chunks(dims, knobs, positions, EVAL_LEAN_CHUNK_COPIES) + tokens * dims.hidden * width
    else:
        logits = EVAL_LOGIT_COPIES["dpo" if stage_of(stage).reference_model else "sft"] * tokens * dims.vocab * 4
    moment = {"held-out logits": logits} if logits >= layer else {"held-out layer forward": layer}
    return {**held, **moment}


def _held_through_evaluation(dims: ModelDims, knobs: Knobs, allocator: Allocator,
                             parts: dict[str, int]) -> dict[str, int]:  # fmt: skip
    """What a training step leaves for the held-out pass: the weights, LoRA's and the optimizer's states
    (gradients are freed after each step) and the run's overhead; in glibc's heap, for a 16-bit checkpoint
    computed as stored (where its eval_overhead was measured), the tensors' own bytes and that."""
    names = ("weights", "lora weights", "optimizer (AdamW)")
    if allocator.heap is None or not native_half(dims, knobs):
        return {**{name: parts[name] for name in names if name in parts}, "overhead": parts["overhead"]}
    trainable = trainable_params(dims, knobs)
    exact = {"weights": int(weight_bytes(dims, knobs)), "lora weights": trainable * 4,
             "optimizer (AdamW)": trainable * optimizer_bytes_per_parameter(knobs.optim)}  # fmt: skip
    return {**{name: exact[name] for name in names if name in parts}, "overhead": allocator.heap.eval_overhead}


def loading_peak(dims: ModelDims, knobs: Knobs, parts: dict[str, int], allocator: Allocator) -> int:
    """The peak while a quantized base loads (the allocator's loading_copies): 0 for a 16-bit one."""
    if knobs.quantization_bit is None:
        return 0
    largest = max(dims.hidden, dims.kv_dim) * max(dims.hidden, dims.ffn)
    copies = allocator.loading_copies[knobs.quantization_bit]
    transient = copies * largest * 4
    if knobs.quantize_embeddings:  # a table arrives in 16 bits and is packed a chunk at a time
        transient = max(transient, dims.vocab * dims.hidden * weight_width(dims, knobs) + PACKING_BYTES)
    return parts["weights"] + parts.get("lora weights", 0) + transient
