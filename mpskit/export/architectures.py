"""The architectures a GGUF export covers, read from a model's config.json once, and what llama.cpp
needs of each: its metadata, its tensors' GGUF names, Llama's q/k rows in llama.cpp's order, and the
rope frequency factors of Llama 3.1's scaling.

What each writes follows llama.cpp's own converter (convert_hf_to_gguf.py): Qwen2 and Qwen3 keep
transformers' q/k layout (llama.cpp rotates them as NEOX does); Llama and Mistral rotate interleaved
pairs there, so their q and k rows are reordered per head. A tied model writes no output.weight:
llama.cpp reads the embeddings in its place. No torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFWriter, RopeScalingType, TensorNameMap, get_tensor_name_map

from mpskit.errors import MpskitError

COVERED = {
    "LlamaForCausalLM": MODEL_ARCH.LLAMA,  # SmolLM2 too
    "MistralForCausalLM": MODEL_ARCH.LLAMA,  # llama.cpp runs Mistral's dense models as Llama
    "Qwen2ForCausalLM": MODEL_ARCH.QWEN2,
    "Qwen3ForCausalLM": MODEL_ARCH.QWEN3,
}
# the rope scalings llama.cpp's converter writes for each (absent or "default": none)
SCALINGS = {MODEL_ARCH.LLAMA: ("linear", "llama3"), MODEL_ARCH.QWEN2: ("yarn",), MODEL_ARCH.QWEN3: ("yarn",)}
SKIPPED = ("rotary_emb.inv_freq",)  # transformers' own buffers, recomputed by llama.cpp


@dataclass(frozen=True)
class ModelShape:
    """What the export needs of a model's config.json."""

    architecture: str
    arch: MODEL_ARCH
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rms_eps: float
    rope_theta: float
    rope: dict  # the scaling's settings; empty for none
    tied: bool

    @property
    def rope_kind(self) -> str:
        return str(self.rope.get("rope_type", self.rope.get("type", "default")))

    @classmethod
    def of(cls, config: dict, where: Path) -> ModelShape:
        """One line for an architecture or a rope scaling the export does not cover."""
        architecture = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
        if architecture not in COVERED:
            raise MpskitError(f"{where}: the GGUF export does not cover {architecture}",
                              f"it covers {', '.join(COVERED)}; export a Hugging Face folder instead (mpskit "
                              "export without --gguf)")  # fmt: skip
        arch = COVERED[architecture]
        # transformers 5 keeps rope_theta and the scaling in rope_parameters; older configs at the top level
        rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
        heads = config["num_attention_heads"]
        shape = cls(
            architecture=architecture,
            arch=arch,
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            ffn=config["intermediate_size"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            vocab=config["vocab_size"],
            context=config.get("max_position_embeddings", 4096),
            rms_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            rope={key: value for key, value in rope.items() if key != "rope_theta"},
            tied=bool(config.get("tie_word_embeddings", False)),
        )
        if shape.rope_kind not in ("default", *SCALINGS[arch]):
            raise MpskitError(f"{where}: {architecture} with rope scaling '{shape.rope_kind}' is not covered",
                              f"the GGUF export writes {', '.join(SCALINGS[arch])} scaling for it; export a "
                              "Hugging Face folder instead (mpskit export without --gguf)")  # fmt: skip
        return shape

    @property
    def arch_name(self) -> str:
        return MODEL_ARCH_NAMES[self.arch]

    def add_metadata(self, writer: GGUFWriter) -> None:
        """The architecture's keys, as llama.cpp's converter writes them."""
        writer.add_block_count(self.layers)
        writer.add_context_length(self.context)
        writer.add_embedding_length(self.hidden)
        writer.add_feed_forward_length(self.ffn)
        writer.add_head_count(self.heads)
        writer.add_head_count_kv(self.kv_heads)
        writer.add_key_length(self.head_dim)
        writer.add_value_length(self.head_dim)
        writer.add_rope_freq_base(self.rope_theta)
        writer.add_layer_norm_rms_eps(self.rms_eps)
        if self.arch == MODEL_ARCH.LLAMA:
            writer.add_vocab_size(self.vocab)
            writer.add_rope_dimension_count(self.head_dim)
        if self.rope_kind == "linear":
            writer.add_rope_scaling_type(RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(self.rope["factor"])
        elif self.rope_kind == "yarn":
            writer.add_rope_scaling_type(RopeScalingType.YARN)
            writer.add_rope_scaling_factor(self.rope["factor"])
            writer.add_rope_scaling_orig_ctx_len(self.rope["original_max_position_embeddings"])

    def gguf_name(self, name: str) -> str | None:
        """The GGUF name of a Hugging Face weight; None for one the file leaves out."""
        if name.endswith(SKIPPED) or (self.tied and name == "lm_head.weight"):
            return None
        found = _names(self.arch, self.layers).get_name(name, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise MpskitError(f"the GGUF export does not know {self.architecture}'s weight {name}",
                              "export a Hugging Face folder instead (mpskit export without --gguf)")  # fmt: skip
        return found

    def reordered_heads(self, name: str) -> int:
        """How many heads a q or k weight (or bias) holds when llama.cpp wants its rows in its own order; 0
        for every other weight and architecture."""
        if self.arch != MODEL_ARCH.LLAMA:
            return 0
        if ".q_proj." in name:
            return self.heads
        return self.kv_heads if ".k_proj." in name else 0

    def extra_tensors(self) -> dict[str, np.ndarray]:
        """Llama 3.1's scaling as llama.cpp reads it: a factor that divides each rotary frequency
        (transformers' _compute_llama3_parameters, as a divisor)."""
        if self.rope_kind != "llama3":
            return {}
        factor = self.rope.get("factor", 8.0)
        low, high = self.rope.get("low_freq_factor", 1.0), self.rope.get("high_freq_factor", 4.0)
        old_context = self.rope.get("original_max_position_embeddings", 8192)
        factors = []
        for index in range(0, self.head_dim, 2):
            wavelength = 2 * math.pi * self.rope_theta ** (index / self.head_dim)
            if wavelength < old_context / high:
                factors.append(1.0)
            elif wavelength > old_context / low:
                factors.append(factor)
            else:
                smooth = (old_context / wavelength - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        return {"rope_freqs.weight": np.array(factors, dtype=np.float32)}


@functools.cache
def _names(arch: MODEL_ARCH, layers: int) -> TensorNameMap:
    """llama.cpp's table of Hugging Face names to GGUF names, built once (it takes tens of milliseconds)."""
    return get_tensor_name_map(arch, layers)


def reorder_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """A block of whole heads' rows from transformers' rotary layout (each head's first half, then its
    second) into llama.cpp's (the halves' rows interleaved): llama.cpp's converter's `permute`."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)
