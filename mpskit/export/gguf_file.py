"""A GGUF file written from a model's safetensors a block of rows at a time, a LoRA adapter merged into
each block as it passes: the export never holds a whole weight, let alone the model.

GGUFWriter (the gguf package) writes the header, the metadata and the tensor table from shapes alone;
each tensor's bytes then stream into its place, block by block: read in float32, the adapter's
rows added (peft's W + scale * B @ A), Llama's q/k rows put in llama.cpp's order, and converted or
quantized (the gguf package's own numpy quantizers, which work row by row, so blocks join exactly).
Which type each tensor gets follows llama.cpp's converter: norms, biases and other vectors stay
float32, a row that does not divide into a quantizer's blocks falls back to f16, and the 4- and 5-bit
files keep the embeddings and the output layer in q8_0 (llama-quantize keeps them wider too). No torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType, GGUFEndian, GGUFWriter, LlamaFileType
from gguf.quants import quantize

from mpskit.errors import MpskitError
from mpskit.export.architectures import ModelShape, reorder_rows
from mpskit.export.lora import LoraAdapter, not_merged, read_adapter
from mpskit.export.safetensors_rows import StoredTensor, base_shards, stored_tensors
from mpskit.export.vocabulary import Vocabulary

Q = GGMLQuantizationType
FILE_TYPES = {  # --gguf TYPE: (the type of the weight matrices, the file's type)
    "f16": (Q.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (Q.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": (Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q5_1": (Q.Q5_1, LlamaFileType.MOSTLY_Q5_1),
    "q5_0": (Q.Q5_0, LlamaFileType.MOSTLY_Q5_0),
    "q4_1": (Q.Q4_1, LlamaFileType.MOSTLY_Q4_1),
    "q4_0": (Q.Q4_0, LlamaFileType.MOSTLY_Q4_0),
}
NARROW = (Q.Q5_1, Q.Q5_0, Q.Q4_1, Q.Q4_0)
WIDE_IN_NARROW_FILES = ("token_embd.weight", "output.weight")
BLOCK_BYTES = 16 * 2**20  # float32 bytes of one block of rows


def check_file_type(name: str) -> None:
    """One line for a type the export does not write; for a K-quant, the command that makes one."""
    if name in FILE_TYPES:
        return
    if "_k" in name.lower():
        raise MpskitError(f"--gguf {name}: K-quants are made by llama.cpp's own llama-quantize, not here",
                          f"export f16, then: llama-quantize FILE.f16.gguf FILE.{name.upper()}.gguf "
                          f"{name.upper()}")  # fmt: skip
    raise MpskitError(f"--gguf {name} is not a type the export writes", f"give one of {', '.join(FILE_TYPES)}")


def tensor_type(name: str, shape: tuple[int, ...], weights: Q) -> Q:
    """The type a tensor is stored in, in a file whose weight matrices are WEIGHTS."""
    if len(shape) < 2 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return Q.F32
    if weights in NARROW and name in WIDE_IN_NARROW_FILES:
        weights = Q.Q8_0
    block, _ = GGML_QUANT_SIZES[weights]
    return Q.F16 if shape[-1] % block else weights


@dataclass(frozen=True)
class Planned:
    """One tensor of the file: its name, shape (as transformers stores it) and type, and its blocks."""

    name: str
    shape: tuple[int, ...]
    kind: Q
    blocks: Callable[[], Iterator[np.ndarray]]

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.kind]
        return int(np.prod(self.shape)) // block * size


class _Streamed:
    """What GGUFWriter.write_tensor_data takes for a tensor (its byte count, and `tofile`), writing the
    tensor's blocks as they are made."""

    def __init__(self, tensor: Planned) -> None:
        self.tensor, self.nbytes = tensor, tensor.nbytes

    def tofile(self, file) -> None:
        written = 0
        for block in self.tensor.blocks():
            file.write(np.ascontiguousarray(block).data)  # a full disk is OSError(ENOSPC), as any write's
            written += block.nbytes
        if written != self.nbytes:
            raise ValueError(f"{self.tensor.name}: {written} bytes made, {self.nbytes} planned")


def plan_model(model: Path, adapter: Path | None, file_type: str) -> tuple[ModelShape, list[Planned]]:
    """The file's tensors for the model in folder MODEL (its config.json and safetensors), with the LoRA
    adapter in folder ADAPTER merged; everything is checked here, before anything is written."""
    shape = ModelShape.of(json.loads((model / "config.json").read_text(encoding="utf-8")), model)
    weights = {name: tensor for shard in base_shards(model) for name, tensor in stored_tensors(shard).items()}
    lora = read_adapter(adapter) if adapter else None
    return shape, plan_tensors(shape, weights, lora, FILE_TYPES[file_type][0], model)


def plan_tensors(shape: ModelShape, weights: dict[str, StoredTensor], adapter: LoraAdapter | None,
                 weight_type: Q, base: Path) -> list[Planned]:  # fmt: skip
    """Every tensor of the file, in the order written: the generated ones, then the model's."""
    planned = [Planned(name, values.shape, Q.F32, lambda values=values: iter([values]))
               for name, values in shape.extra_tensors().items()]  # fmt: skip
    merged = set()
    for hf_name, stored in weights.items():
        name = shape.gguf_name(hf_name)
        if name is None:
            continue
        changes = adapter is not None and hf_name in adapter.pairs
        if changes:
            merged.add(hf_name)
        kind = tensor_type(name, stored.shape, weight_type)
        blocks = _blocks(stored, adapter if changes else None, hf_name, shape.reordered_heads(hf_name),
                         shape.head_dim, kind)  # fmt: skip
        planned.append(Planned(name, stored.shape, kind, blocks))
    if adapter is not None and (error := not_merged(adapter, merged, base)):
        raise error
    return planned


def _blocks(stored: StoredTensor, adapter: LoraAdapter | None, name: str, heads: int, head_dim: int,
            kind: Q) -> Callable[[], Iterator[np.ndarray]]:  # fmt: skip
    step = stored.rows if len(stored.shape) < 2 else max(1, BLOCK_BYTES // (4 * stored.row_elements))
    if heads:  # whole heads per block: llama.cpp's order is per head
        step = max(head_dim, step // head_dim * head_dim)

    def blocks() -> Iterator[np.ndarray]:
        for start in range(0, stored.rows, step):
            stop = min(stored.rows, start + step)
            rows = stored.read_rows(start, stop)
            if adapter is not None:  # merged in float32, then stored in the base's width, as the HF export stores it
                rows = stored.in_own_width(rows + adapter.delta_rows(name, start, stop))
            if heads:
                rows = reorder_rows(rows, (stop - start) // head_dim)
            yield _converted(rows, kind)

    return blocks


def _converted(rows: np.ndarray, kind: Q) -> np.ndarray:
    if kind == Q.F32:
        return rows.astype(np.float32, copy=False)
    if kind == Q.F16:
        return rows.astype(np.float16)
    return quantize(np.ascontiguousarray(rows), kind)


def write_gguf(path: Path, name: str, shape: ModelShape, vocabulary: Vocabulary, tensors: list[Planned],
               file_type: str) -> None:  # fmt: skip
    """PATH: the whole file (the caller writes it under a hidden name and renames it when done)."""
    writer = GGUFWriter(None, shape.arch_name)
    writer.add_type("model")
    writer.add_name(name)
    shape.add_metadata(writer)
    writer.add_file_type(FILE_TYPES[file_type][1])
    writer.add_quantization_version(GGML_QUANT_VERSION)
    vocabulary.add_to(writer)
    for tensor in tensors:
        writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(np.float32), tensor.nbytes, raw_dtype=tensor.kind)
    try:
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in tensors:
            writer.write_tensor_data(_Streamed(tensor), tensor_endianess=GGUFEndian.LITTLE)
        writer.flush()
        os.fsync(writer.fout[0].fileno())
    finally:
        writer.close()
