"""The input embeddings and the output layer in the run's bits (quantize_embeddings), as mlx-lm does.

bitsandbytes, through transformers and LLaMA-Factory, quantizes the decoder's linear layers only: a
14B Qwen's embeddings and output layer (152,064 x 5,120 each) stay in 16 bits, 3.1 GB. Here each is
packed by bitsandbytes' own functions (4 bits: blocks of 64 weights, each with a float32 scale; 8
bits: int8 rows, each with a float32 scale) and only the rows a computation needs are dequantized:
the embedding its tokens' rows, the output layer a chunk of the vocabulary at a time. lean_logits.py
computes the loss over those chunks, so neither whole logits nor the whole 16-bit weight ever exist.
A tied model keeps one packed copy, which both modules read. Both are frozen: LoRA adapts neither.

The two weights are packed as the loader sets them (`packing_loader`, bends.VOCAB_LOADER), so their
16-bit copies never sit beside the 4-bit base; the modules hold their packs as plain attributes, out
of the state dict, and an adapter saves, resumes and exports as any other. Imports torch.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator

import torch

from mpskit.engine.quantized import import_bitsandbytes
from mpskit.errors import MpskitError

# The memory model's constants: one dequantized chunk of the output layer's rows, the weights per 4-bit
# scale (rows of a width divisible by it are whole blocks), and the rows packed at a time as a table loads.
from mpskit.plan.memory import DEQUANTIZED_ROWS_BYTES, PACK_BLOCK, PACKING_ROWS_BYTES

# the packing loader stands in for transformers' loader and says what it packed where the loader's lines go
LOADER_LOG = logging.getLogger("transformers.core_model_loading")


class PackedRows:
    """A frozen (rows, width) weight packed in `bits`, dequantized a range of rows at a time."""

    def __init__(self, weight: torch.Tensor, bits: int, quant_type: str = "nf4") -> None:
        import_bitsandbytes()
        from bitsandbytes import functional

        weight = weight.detach()
        self.shape, self.dtype, self.bits, self.quant_type = tuple(weight.shape), weight.dtype, bits, quant_type
        rows, width = self.shape
        if bits == 4 and width % PACK_BLOCK:
            raise MpskitError(f"quantize_embeddings=true: the model's tables are {width} wide, not whole 4-bit blocks "
                              f"of {PACK_BLOCK}", "set quantization_bit=8, or quantize_embeddings=false")  # fmt: skip
        per_row = width // 2 if bits == 4 else width  # bytes: two 4-bit weights a byte, or one int8
        self.packed = torch.empty(rows, per_row, dtype=torch.uint8 if bits == 4 else torch.int8, device=weight.device)
        self.scales = torch.empty(rows, width // PACK_BLOCK if bits == 4 else 1, device=weight.device)
        self.code = None
        # a chunk of rows at a time: bitsandbytes' CPU quantizer holds several times its input while it
        # works, 1.9 GB for a 0.26 GB output layer at once
        step = max(1, PACKING_ROWS_BYTES // (width * weight.dtype.itemsize))
        for start in range(0, rows, step):
            chunk = weight[start : start + step].contiguous()
            if bits == 4:
                packed, state = functional.quantize_4bit(chunk, blocksize=PACK_BLOCK, quant_type=quant_type)
                self.code = state.code
                scales = state.absmax
            else:
                packed, scales, _ = functional.int8_vectorwise_quant(chunk.float())
            self.packed[start : start + len(chunk)] = packed.view(len(chunk), per_row)
            self.scales[start : start + len(chunk)] = scales.view(len(chunk), -1)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Rows start..end in the weight's own dtype."""
        return self._dequantize(self.packed[start:end], self.scales[start:end])

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows `ids` name, dequantized, shaped (*ids.shape, width)."""
        flat = ids.reshape(-1)
        return self._dequantize(self.packed[flat], self.scales[flat]).view(*ids.shape, self.shape[1])

    def _dequantize(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """Packed rows with their scales, as (rows, width) in the weight's dtype."""
        if self.bits == 8:
            return (packed.float() * (scales / 127)).to(self.dtype)
        from bitsandbytes import functional

        shape = torch.Size((len(packed), self.shape[1]))
        state = functional.QuantState(absmax=scales.reshape(-1), shape=shape, code=self.code, blocksize=PACK_BLOCK,
                                      quant_type=self.quant_type, dtype=self.dtype)  # fmt: skip
        return functional.dequantize_4bit(packed.reshape(-1), state)

    def chunks(self, rows: int | None = None):
        """(start, end, rows start..end dequantized) over the whole weight, `rows` at a time (by
        default as many as DEQUANTIZED_ROWS_BYTES holds)."""
        for start, end in self.ranges(rows):
            yield start, end, self.rows(start, end)

    def ranges(self, rows: int | None = None) -> Iterator[tuple[int, int]]:
        """(start, end) of those chunks: a loop that dequantizes each itself and drops it before the
        next holds one chunk (a loop over `chunks` holds the last while the next is made)."""
        rows = rows or self.chunk_rows()
        for start in range(0, self.shape[0], rows):
            yield start, min(start + rows, self.shape[0])

    def chunk_rows(self) -> int:
        """How many rows one dequantized chunk holds under DEQUANTIZED_ROWS_BYTES."""
        return max(1, DEQUANTIZED_ROWS_BYTES // (self.shape[1] * self.dtype.itemsize))


class PackedEmbedding(torch.nn.Module):
    """An input embedding whose table is packed: a lookup dequantizes its tokens' rows."""

    def __init__(self, pack: PackedRows) -> None:
        super().__init__()
        self.pack = pack
        self.num_embeddings, self.embedding_dim = pack.shape

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.pack.gather(input_ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.pack.bits}-bit"


class PackedOutput(torch.nn.Module):
    """An output layer (no bias) whose weight is packed: logits are computed a chunk of the
    vocabulary at a time, each chunk's rows dequantized (generation, the last position's logits)."""

    def __init__(self, pack: PackedRows) -> None:
        super().__init__()
        self.pack = pack
        self.out_features, self.in_features = pack.shape
        self.skipping = False

    @contextlib.contextmanager
    def skipped(self) -> Iterator[None]:
        """Within: the layer computes nothing and gives zeros (lean_logits.py reads the hidden states)."""
        self.skipping = True
        try:
            yield
        finally:
            self.skipping = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.skipping:
            return hidden.new_zeros(*hidden.shape[:-1], self.out_features, dtype=torch.float32)
        rows_in = hidden.to(self.pack.dtype)
        return torch.cat([torch.nn.functional.linear(rows_in, weight) for _, _, weight in self.pack.chunks()], dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.pack.bits}-bit"


def vocab_paths(model: torch.nn.Module) -> dict[str, str]:
    """The input embedding's and the output layer's module paths in MODEL: {"input": ..., "output": ...}."""
    names = {id(module): name for name, module in model.named_modules()}
    paths = {"input": names[id(model.get_input_embeddings())]}
    output = model.get_output_embeddings()
    if output is not None:
        paths["output"] = names[id(output)]
    return paths


def packing_loader(original, bits: int, quant_type: str):
    """transformers' `set_param_for_module`, packing the embedding's and the output layer's weights as
    they arrive (a tied output layer reads the embedding's pack) and setting everything else as before.
    The two paths are looked up once per model: the loader calls this for every weight."""
    paths_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its two paths

    def set_param_for_module(model, target_name, param_value, loading_info, distributed_operation, hf_quantizer):
        if model not in paths_of:
            paths_of[model] = vocab_paths(model)
        paths = paths_of[model]
        weights = {f"{path}.weight": role for role, path in paths.items()}
        role = weights.get(target_name)
        if role is None:
            return original(model, target_name, param_value, loading_info, distributed_operation, hf_quantizer)
        pack = PackedRows(param_value, bits, quant_type)
        model.set_submodule(paths[role], PackedEmbedding(pack) if role == "input" else PackedOutput(pack))
        LOADER_LOG.info(f"mpskit packed {target_name} ({' x '.join(map(str, pack.shape))}) in {bits} bits: "
                        f"{param_value.nbytes / 2**20:.1f} -> {pack.nbytes / 2**20:.1f} MiB")  # fmt: skip
        loading_info.missing_keys.discard(target_name)
        if role == "input" and getattr(model.config, "tie_word_embeddings", False) and "output" in paths:
            model.set_submodule(paths["output"], PackedOutput(pack))
            loading_info.missing_keys.discard(f"{paths['output']}.weight")
        _untie(model, set(weights))
        return None

    return set_param_for_module


def _untie(model: torch.nn.Module, names: set[str]) -> None:
    """Drop the packed weights from the model's tying table: the packs are shared already, and
    transformers would otherwise look their 16-bit parameters up after loading."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    for target in [target for target, source in tied.items() if target in names or source in names]:
        tied.pop(target)
