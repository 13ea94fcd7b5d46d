"""Whose allocator holds a device's tensors: the one switch the memory plan and the run's heap trims share.

The plan's figures for a device are only as good as what was measured under its allocator
(plan/allocators.py holds one profile per name here). The run trims glibc's heap where, and only
where, the plan counted trimmed figures: both ask `allocator_for`.
"""

from __future__ import annotations

import functools
import platform

EXACT = "exact"  # CUDA's caching allocator: its counters are the tensors' own bytes
GLIBC_HEAP = "glibc_heap"  # the CPU on glibc (Linux): freed pages stay in the heap until trimmed
UNMEASURED = "unmeasured"  # MPS, and the CPU on another C library (macOS): no figure measured there
GLIBC = "glibc"


@functools.cache
def this_c_library() -> str | None:
    """This machine's C library as Python names it ("glibc"), or None (macOS, musl)."""
    return platform.libc_ver()[0] or None


def allocator_for(device: str, c_library: str | None) -> str:
    """The allocator a run's tensors live in, by its device and the machine's C library."""
    if device == "cuda":
        return EXACT
    if device == "cpu" and c_library == GLIBC:
        return GLIBC_HEAP
    return UNMEASURED


def trims_heap(device: str) -> bool:
    """Whether a run on `device` here hands glibc's free heap pages back (malloc_trim)."""
    return allocator_for(device, this_c_library()) == GLIBC_HEAP
