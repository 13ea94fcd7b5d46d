"""A plain LoRA adapter (LLaMA-Factory's) read as what it adds to each base weight: W + scale * B @ A,
peft's formula, in float32. Both merges read it here: the safetensors folder of a 4-bit run's export
(tools/merge_shards.py) and the GGUF file, which merges a block of rows at a time. No torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpskit.errors import MpskitError
from mpskit.export.safetensors_rows import stored_tensors

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # peft's name for the wrapped model's own keys
NOT_PLAIN = ("use_dora", "fan_in_fan_out", "modules_to_save", "rank_pattern", "alpha_pattern", "lora_bias")


@dataclass(frozen=True)
class LoraAdapter:
    """{base weight name: (A, B)} and the scale of B @ A."""

    pairs: dict[str, tuple[np.ndarray, np.ndarray]]
    scale: float

    def delta_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """scale * B @ A for rows START to STOP of weight NAME (float32)."""
        a, b = self.pairs[name]
        return self.scale * (b[start:stop] @ a)


def read_adapter(adapter: Path) -> LoraAdapter:
    """The adapter in folder ADAPTER; one line for any adapter a per-weight merge cannot take."""
    config = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    unsupported = [key for key in NOT_PLAIN if config.get(key)]
    if config.get("peft_type", "LORA") != "LORA" or unsupported:
        what = ", ".join(unsupported) or config.get("peft_type")
        raise MpskitError(
            f"{adapter}: a weight-by-weight merge takes plain LoRA adapters, not {what}",
            "merge on a machine that holds the 16-bit base: llamafactory-cli export with the run's adapter",
        )
    rank, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights = {name: tensor.read() for name, tensor in stored_tensors(adapter / ADAPTER_WEIGHTS).items()}
    pairs = {}
    for key, a in weights.items():
        if key.endswith(".lora_A.weight"):
            module = key.removeprefix(PREFIX).removesuffix(".lora_A.weight")
            pairs[f"{module}.weight"] = (a, weights[key.replace(".lora_A.", ".lora_B.")])
    return LoraAdapter(pairs, scale)


def not_merged(adapter: LoraAdapter, merged: set[str], base: Path) -> MpskitError | None:
    """The error for an adapter that changes weights the base does not hold, or None."""
    missing = sorted(set(adapter.pairs) - merged)
    if not missing:
        return None
    return MpskitError(f"the adapter changes {missing[0]}, which {base} does not hold ({len(missing)} such weights)",
                       "export with the base the run trained on (its model_name_or_path)")  # fmt: skip
