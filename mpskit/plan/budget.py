"""The memory budget of a machine: what one training process may use. No torch import."""

from __future__ import annotations

from dataclasses import dataclass

from mpskit.machine.hardware import Hardware
from mpskit.machine.mps_env import hard_cap_gb
from mpskit.plan.memory import GB

# The estimate must fit with this share of the budget to spare: bench/memory_accuracy.py's worst
# underestimate is 13.7% (DPO with checkpointing on Qwen2.5-0.5B dims); the median error is 1.9%.
SAFETY_MARGIN = 0.15
CUDA_RESERVE_GB = 1.0  # CUDA context and allocator fragmentation


@dataclass
class Budget:
    training_bytes: int  # what the run may add on top of the imported framework
    why: str


def budget_for(
    hw: Hardware, device: str, framework_bytes: int, override_gb: float | None = None, processes: int = 1
) -> Budget:
    """Per process: on MPS the smaller of the watermark cap and RAM minus headroom; on CUDA its GPU
    less a reserve; on the CPU the available RAM minus headroom, shared by the processes of this
    machine. RAM budgets also leave room for the framework."""
    framework_gb = framework_bytes / GB
    if override_gb is not None:
        return Budget(int(override_gb * GB), f"memory_budget_gb={override_gb:g}")
    if device == "cuda":
        gb = (hw.gpu_memory_gb or 0) - CUDA_RESERVE_GB
        return Budget(int(gb * GB), f"{hw.gpu_memory_gb} GB GPU minus {CUDA_RESERVE_GB} GB reserve")
    headroom = hw.headroom_gb or 0.0
    if device == "mps":
        cap = hard_cap_gb(hw)
        ram_left = hw.ram_gb - headroom - framework_gb
        why = (
            f"min(MPS cap {cap:.2f} GB, {hw.ram_gb} GB RAM - {headroom} GB headroom - {framework_gb:.2f} GB framework)"
        )
        return Budget(int(min(cap, ram_left) * GB), why)
    ram, what = hw.ram_gb, "RAM"
    if hw.source == "detected":
        import psutil

        ram, what = psutil.virtual_memory().available / GB, "available RAM"
    share = f" / {processes} processes" if processes > 1 else ""
    gb = (ram - headroom) / processes - framework_gb
    why = f"({ram:.1f} GB {what} - {headroom} GB headroom){share} - {framework_gb:.2f} GB framework"
    return Budget(int(gb * GB), why)
