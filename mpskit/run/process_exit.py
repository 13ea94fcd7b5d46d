"""A run's process leaves as soon as Python's own exit is done.

A CUDA build of torch loads its CUDA libraries into every process, on a machine without a GPU too.
At the C library's exit their destructors page in their code: after `import torch` alone the file
pages resident went from 0.23 to 0.36 GB (libcublasLt, libcusparseLt, libtorch_cuda). GNU time,
getrusage and a scheduler count that in the process's peak, after the run has written everything:
0.04-0.07 GB above an 85M-weight run's own peak here (bench/qlora.py). So once Python's exit has
joined the threads and run every atexit handler, a run's process flushes its streams and leaves.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import sys

_CODE: list[int] = []  # the exit code main() returned; empty: leave the usual way


def leave_after_python_exit() -> None:
    """Call before anything else registers an exit handler: the last one to run is this one."""
    atexit.register(_leave)


def exit_code_is(code: int | None) -> None:
    """The exit code main() returned (None: it did not return one; the usual exit then)."""
    _CODE[:] = [] if code is None else [code]


def _leave() -> None:
    if not _CODE:
        return
    logging.shutdown()  # its own handler, registered as logging was imported (before this one), would run after
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)  # what the C libraries wrote to their own buffered streams
    os._exit(_CODE[0])
