"""A LoRA adapter merged into its 16-bit base one tensor at a time, never the whole model in memory.

What `mpskit export` does for a run on a quantized base: LLaMA-Factory merges only into a base it
has loaded whole in 16 bits (7B: 15 GB), which is what a 16 GB Mac cannot hold. Every merged weight
keeps its dtype and shape, so each .safetensors file of the base keeps its header and layout: it is
copied, then each LoRA target's bytes are overwritten with W + scale * B @ A (computed in float32,
peft's formula). The peak is one target weight and its float32 copies. Imports torch.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from mpskit.engine.quantized import SafeFileOnDemand
from mpskit.errors import MpskitError

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # peft's name for the wrapped model's own keys
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")


def lora_deltas(adapter: Path) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """{base weight name: (A, B)} and the scale of B @ A, for a plain LoRA adapter (LLaMA-Factory's)."""
    config = json.loads((adapter / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    unsupported = [key for key in ("use_dora", "fan_in_fan_out", "modules_to_save", "rank_pattern", "alpha_pattern",
                                   "lora_bias") if config.get(key)]  # fmt: skip
    if config.get("peft_type", "LORA") != "LORA" or unsupported:
        what = ", ".join(unsupported) or config.get("peft_type")
        raise MpskitError(
            f"{adapter}: a shard-by-shard merge takes plain LoRA adapters, not {what}",
            "merge on a machine that holds the 16-bit base: llamafactory-cli export with the run's adapter",
        )
    rank, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights = load_file(adapter / ADAPTER_WEIGHTS)
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, a in weights.items():
        if key.endswith(".lora_A.weight"):
            module = key.removeprefix(PREFIX).removesuffix(".lora_A.weight")
            pairs[f"{module}.weight"] = (a, weights[key.replace(".lora_A.", ".lora_B.")])
    return pairs, scale


def base_shards(base: Path) -> list[Path]:
    """The weight files transformers loads: those the index names, or model.safetensors alone (a
    consolidated.safetensors beside them, as Mistral's folders hold, is another copy of the weights)."""
    index = base / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            fix = "point the run at a base saved by transformers"
            raise MpskitError(f"{index} is not a readable index", fix) from err
        return [base / name for name in sorted(names)]
    if (base / "model.safetensors").is_file():
        return [base / "model.safetensors"]
    raise MpskitError(f"{base} has no model.safetensors or its index", "point the run at a base saved as safetensors")


def merge_shard(source: Path, target: Path, deltas: dict, scale: float) -> set[str]:
    """TARGET: SOURCE with every weight named in DELTAS merged; the names it merged."""
    shutil.copyfile(source, target)
    merged = set()
    reader = SafeFileOnDemand(source)
    with reader, open(target, "r+b") as out:
        for name in reader.keys():
            if name not in deltas:
                continue
            a, b = deltas[name]
            weight = reader.get_tensor(name)
            result = (weight.float() + scale * (b.float() @ a.float())).to(weight.dtype).contiguous()
            start, end = reader.byte_range(name)
            out.seek(start)
            written = out.write(memoryview(result.view(torch.uint8).numpy()))
            if written != end - start:
                raise OSError(f"{target}: wrote {written} of {end - start} bytes of {name}")
            merged.add(name)
    return merged


def merge_by_shard(base: Path, adapter: Path, out: Path) -> None:
    """The base's weights with the adapter merged, its config and index, into OUT (an existing folder)."""
    deltas, scale = lora_deltas(adapter)
    merged: set[str] = set()
    for shard in base_shards(base):
        merged |= merge_shard(shard, out / shard.name, deltas, scale)
    missing = sorted(set(deltas) - merged)
    if missing:
        raise MpskitError(
            f"the adapter changes {missing[0]}, which {base} does not hold ({len(missing)} such weights)",
            "export with the base the run trained on (its model_name_or_path)",
        )
    for name in BASE_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, out / name)
