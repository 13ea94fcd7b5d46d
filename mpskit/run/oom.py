"""Out-of-memory errors: recognise them on MPS, CUDA and the CPU, with their figures.

accelerate's batch-size finder does not know the MPS text, so mpskit reads the errors itself. The
fallback ladder that follows one is knobs.next_rung. No torch import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "MPS backend out of memory (MPS allocated: 8.93 GB, other allocations: 1.53 GB, max allowed: 12.48 GB).
#  Tried to allocate 256.00 MB on private pool. ..."
MPS_OOM = re.compile(
    r"MPS backend out of memory \(MPS allocated: (?P<allocated>[\d.]+ \w+), "
    r"other allocations: (?P<other>[\d.]+ \w+), max allowed: (?P<allowed>[\d.]+ \w+)\)\. "
    r"Tried to allocate (?P<request>[\d.]+ \w+)"
)
CUDA_OOM = re.compile(r"CUDA out of memory\. Tried to allocate (?P<request>[\d.]+ \w+)")
CPU_OOM = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory).*?(?P<request>\d+) bytes")
UNITS = {"B": 1, "KB": 1024, "KIB": 1024, "MB": 1024**2, "MIB": 1024**2, "GB": 1024**3, "GIB": 1024**3}


@dataclass
class OutOfMemory:
    device: str
    request_gb: float | None = None
    allocated_gb: float | None = None  # MPS: tensors; CUDA: not parsed
    other_gb: float | None = None
    allowed_gb: float | None = None

    def figures(self) -> str:
        parts = [f"{name} {value:.2f} GB" for name, value in (
            ("tried to allocate", self.request_gb), ("allocated", self.allocated_gb),
            ("other allocations", self.other_gb), ("max allowed", self.allowed_gb),
        ) if value is not None]  # fmt: skip
        return ", ".join(parts) or "no figures in the message"


def _gb(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS.get(unit.upper(), 1) / 1024**3


def recognise(error: BaseException) -> OutOfMemory | None:
    """The out-of-memory error in `error` or its causes, with its figures; None if it is something else."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if match := MPS_OOM.search(text):
            return OutOfMemory("mps", *(_gb(match[k]) for k in ("request", "allocated", "other", "allowed")))
        if type(error).__name__ == "OutOfMemoryError" or "CUDA out of memory" in text:
            match = CUDA_OOM.search(text)
            return OutOfMemory("cuda", _gb(match["request"]) if match else None)
        if isinstance(error, MemoryError) or "DefaultCPUAllocator" in text:
            match = CPU_OOM.search(text)
            return OutOfMemory("cpu", int(match["request"]) / 1024**3 if match else None)
        error = error.__cause__ or error.__context__
    return None
