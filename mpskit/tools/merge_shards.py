"""A LoRA adapter merged into its 16-bit base one tensor at a time, never the whole model in memory.

What `mpskit export` does for a run on a quantized base: LLaMA-Factory merges only into a base it
has loaded whole in 16 bits (7B: 15 GB), which is what a 16 GB Mac cannot hold. Every merged weight
keeps its dtype and shape, so each .safetensors file of the base keeps its header and layout: it is
copied, then each LoRA target's bytes are overwritten with W + scale * B @ A (computed in float32,
peft's formula). The peak is one target weight and its float32 copies. Imports torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from mpskit.engine.quantized import SafeFileOnDemand
from mpskit.export.lora import LoraAdapter, not_merged, read_adapter
from mpskit.export.safetensors_rows import base_shards

BASE_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")


def merge_shard(source: Path, target: Path, adapter: LoraAdapter) -> set[str]:
    """TARGET: SOURCE with every weight the adapter changes merged; the names it merged."""
    shutil.copyfile(source, target)
    merged = set()
    reader = SafeFileOnDemand(source)
    with reader, open(target, "r+b") as out:
        for name in reader.keys():
            if name not in adapter.pairs:
                continue
            a, b = map(torch.from_numpy, adapter.pairs[name])
            weight = reader.get_tensor(name)
            result = (weight.float() + adapter.scale * (b @ a)).to(weight.dtype).contiguous()
            start, end = reader.byte_range(name)
            out.seek(start)
            written = out.write(memoryview(result.view(torch.uint8).numpy()))
            if written != end - start:
                raise OSError(f"{target}: wrote {written} of {end - start} bytes of {name}")
            merged.add(name)
    return merged


def merge_by_shard(base: Path, adapter: Path, out: Path) -> None:
    """The base's weights with the adapter merged, its config and index, into OUT (an existing folder)."""
    lora = read_adapter(adapter)
    merged: set[str] = set()
    for shard in base_shards(base):
        merged |= merge_shard(shard, out / shard.name, lora)
    if error := not_merged(lora, merged, base):
        raise error
    for name in BASE_FILES:
        if (base / name).is_file():
            shutil.copyfile(base / name, out / name)
