"""A safetensors file read a block of rows at a time, as float32, with plain file reads.

A streamed export holds one block of one weight, never a whole weight: the 7B embedding alone is 2 GB
in float32. Plain reads, not a memory map, so the file's pages stay in the page cache and never count
in the process's resident memory (a map's touched pages do, until it is closed). The header is read by
the gguf package's own safetensors reader. No torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.utility import SafetensorsLocal

from mpskit.errors import MpskitError

WIDTHS = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor's place in a safetensors file: enough to read any block of its rows."""

    path: Path
    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_elements(self) -> int:
        return math.prod(self.shape[1:])

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows START to STOP in float32, shaped as the tensor's rows are."""
        width, count = WIDTHS[self.dtype], (stop - start) * self.row_elements
        with open(self.path, "rb") as file:
            data = os.pread(file.fileno(), count * width, self.offset + start * self.row_elements * width)
        if len(data) != count * width:
            raise MpskitError(f"{self.path} ends inside a tensor", "point the run at a whole model (saved again)")
        if self.dtype == "BF16":  # bfloat16 is float32's upper half
            rows = (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            rows = np.frombuffer(data, dtype=np.float16 if self.dtype == "F16" else np.float32).astype(np.float32)
        return rows.reshape((stop - start, *self.shape[1:]) if self.shape else ())

    def in_own_width(self, rows: np.ndarray) -> np.ndarray:
        """Float32 ROWS rounded to this tensor's own type (to nearest, ties to even), back in float32."""
        if self.dtype == "F16":
            return rows.astype(np.float16).astype(np.float32)
        if self.dtype == "BF16":  # float32's upper half, rounded as torch's .to(torch.bfloat16) rounds
            bits = np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32)
            rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32)
            return np.where(np.isnan(rows), np.float32("nan"), rounded.view(np.float32))
        return rows

    def read(self) -> np.ndarray:
        return self.read_rows(0, self.rows).reshape(self.shape)


def stored_tensors(path: Path) -> dict[str, StoredTensor]:
    """Every tensor in one safetensors file, by name; one line for a file that is none, or holds a type
    other than float32, float16 or bfloat16."""
    try:
        with SafetensorsLocal(path) as tensors:
            found = {name: StoredTensor(path, entry.data_range.offset, entry.dtype, tuple(entry.shape))
                     for name, entry in tensors.items()}  # fmt: skip
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as err:
        raise MpskitError(f"{path} is not a readable safetensors file ({err})"[:300],
                          "point the run at a model saved by transformers") from None  # fmt: skip
    odd = sorted({t.dtype for t in found.values()} - set(WIDTHS))
    if odd:
        raise MpskitError(f"{path} holds {odd[0]} tensors; the export reads float32, float16 and bfloat16",
                          "save the model in one of those first")  # fmt: skip
    return found


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
