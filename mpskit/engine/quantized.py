"""A base quantized as it loads (quantization_bit), in the memory its bits promise.

transformers quantizes a 16-bit checkpoint one weight at a time as it loads it, but it reads the
shards through memory maps. Every page it reads to quantize stays mapped, and the 16-bit tensors it
keeps (embeddings, norms, the output layer) are views that keep their shards mapped for the whole
run: the process then holds the whole 16-bit base besides the quantized one (on this CPU, 1.5 GB
above the imports for a 268M-weight model whose 16-bit run takes 0.8 GB). `SafeFileOnDemand` has
the loader read each tensor with a plain file read instead (bends.READ_ON_DEMAND): its bytes live in
memory of their own until the weight is quantized, and the checkpoint's pages are never mapped.
16-bit runs keep the maps (their weights are read in place). In training, `trim_between_layers`
hands back the pages of the dequantized copies that glibc keeps.

On a CPU with AVX512-BF16, bitsandbytes' `Linear4bit.forward` repacks its weight for a faster
inference kernel the first time it runs in eval mode without gradients (a held-out evaluation), and
nothing packs it back: the next training step then fails in `matmul_4bit`, which adds a layer's bias
in place (Qwen's q/k/v) to a result that requires grad. A training run says it has no AVX512-BF16
(bends.TRAINING_LAYOUT), so a held-out evaluation runs the very kernel training runs, and training
goes on after it. MPS and CUDA never take that branch (it is for CPU inputs only); `mpskit chat` and
`eval`, which never train, keep the fast inference layout. Imports torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import struct
from collections.abc import Iterator

import torch
from transformers import modeling_utils

from mpskit.machine.allocator import trims_heap

# bitsandbytes' CPU backend offers a kernel fetched from the Hugging Face hub and warns, as it is
# imported, when the `kernels` package is missing; mpskit fetches nothing at run time.
HUB_KERNEL_LOGGER = "bitsandbytes.backends.cpu.ops"


def _not_hub_kernel_offer(record: logging.LogRecord) -> bool:
    return "kernels-community" not in str(record.msg)


def import_bitsandbytes() -> None:
    """Import bitsandbytes where it is installed, without its offer of hub kernels.

    peft imports it while it wraps any model in LoRA when it is installed, 16-bit or not: imported
    with the other libraries, its ~50 MB of code stays out of the memory a run measures as its own."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return
    offers = logging.getLogger(HUB_KERNEL_LOGGER)
    if _not_hub_kernel_offer not in offers.filters:
        offers.addFilter(_not_hub_kernel_offer)
    import bitsandbytes  # noqa: F401


def _glibc_trim():
    """glibc's malloc_trim where the CPU's tensors live in glibc's heap (machine/allocator.py, the switch
    the memory plan reads too); else None (macOS's allocator hands pages back on its own)."""
    if not trims_heap("cpu"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _glibc_trim()


def trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc only; other allocators do it themselves).

    Quantizing a weight on the CPU makes several short-lived copies of it beside the small quantized
    result that stays; glibc keeps the freed copies' pages between those results, so without a trim the
    load can take several times the base's size (seen here: 0.26 to 1.5 GB for the same 0.5 GB base)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class _TensorOnDemand:
    """One tensor of a .safetensors file, as safetensors' slice object: read when indexed."""

    def __init__(self, file, offset: int, entry: dict) -> None:
        self._file, self._entry = file, entry
        start, end = entry["data_offsets"]
        self._offset, self._size = offset + start, end - start

    def get_shape(self) -> list[int]:
        return list(self._entry["shape"])

    def get_dtype(self) -> str:
        return self._entry["dtype"]

    def __getitem__(self, index) -> torch.Tensor:
        trim_heap()
        data = torch.empty(self._size, dtype=torch.uint8)
        self._file.seek(self._offset)
        if self._file.readinto(memoryview(data.numpy())) != self._size:
            raise OSError(f"{self._file.name}: the file ends inside tensor data")
        dtype = modeling_utils.str_to_torch_dtype[self.get_dtype()]
        return data.view(dtype).reshape(self.get_shape())[index]


class SafeFileOnDemand:
    """safetensors' `safe_open` for transformers' loader (keys, get_slice, get_tensor, metadata, and a
    context manager), reading tensors with file reads instead of a memory map."""

    def __init__(self, path, framework: str = "pt", device: str = "cpu") -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed by __exit__, as the loader calls it)
        (length,) = struct.unpack("<Q", self._file.read(8))
        header = json.loads(self._file.read(length))
        self._metadata = header.pop("__metadata__", None)
        self._entries, self._offset = header, 8 + length

    def keys(self) -> list[str]:
        return sorted(self._entries)  # as safe_open lists them

    def metadata(self) -> dict | None:
        return self._metadata

    def byte_range(self, name: str) -> tuple[int, int]:
        """Where the tensor's bytes lie in the file."""
        start, end = self._entries[name]["data_offsets"]
        return self._offset + start, self._offset + end

    def get_slice(self, name: str) -> _TensorOnDemand:
        return _TensorOnDemand(self._file, self._offset, self._entries[name])

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.get_slice(name)[...]

    def __enter__(self) -> SafeFileOnDemand:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def _trim_before_decoder_layer(module: torch.nn.Module, inputs: tuple) -> None:
    if type(module).__name__.endswith("DecoderLayer"):
        trim_heap()


@contextlib.contextmanager
def trim_between_layers() -> Iterator[None]:
    """Within: the heap's free pages go back to the system before each decoder layer runs (its
    forward, and its recomputed forward under checkpointing), on glibc.

    A quantized layer dequantizes each weight for its matmul and frees the copy right after: on the
    CPU, glibc keeps those MB-sized buffers' pages in the heap between the tensors that stay, and the
    peak then held tenths of a GB of free pages, more in one run than in the next. Trimmed, the peak
    is what the weights promise and the same from run to run; the steps are slower, as the pages
    fault in again (bench/qlora.py). A CUDA run dequantizes on the GPU: nothing to trim."""
    if _MALLOC_TRIM is None or torch.cuda.is_available():
        yield
        return
    handle = torch.nn.modules.module.register_module_forward_pre_hook(_trim_before_decoder_layer)
    try:
        yield
    finally:
        handle.remove()


def round_trip(device: str) -> float:
    """A random weight quantized to NF4 (double quantization, as LLaMA-Factory asks) on `device` and
    dequantized: the mean error over the mean size of its values (about 0.09 when 4 bits work)."""
    import_bitsandbytes()
    from bitsandbytes.functional import dequantize_4bit, quantize_4bit

    weight = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)).to(device)
    packed, state = quantize_4bit(weight, quant_type="nf4", compress_statistics=True)
    back = dequantize_4bit(packed, state).float()
    return float((back - weight).abs().mean() / weight.abs().mean())
