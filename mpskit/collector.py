"""Python's cycle collector, kept off the libraries' own objects.

Importing torch, transformers and LLaMA-Factory makes millions of objects that live as long as the
process. A full collection walks every one of them: during the imports, at each later full collection,
and several times as the interpreter exits (2 s here after a finished run: three times the tiny
model's 20 training steps). None of them is garbage. So the collector pauses while they are imported,
and `gc.freeze` then moves them out of every later collection. A command line freezes what is left
when its work is done, so its exit walks nothing.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_FROZEN = False  # the libraries' objects are out of the collector's walks already


@contextlib.contextmanager
def libraries_imported() -> Iterator[None]:
    """The first time in a process: no collection within; after it, everything made so far is out of
    every later collection. Later uses change nothing: the libraries are imported by then, and what
    they would freeze is the process's own, garbage included (a test process's old models)."""
    global _FROZEN
    if _FROZEN:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _FROZEN = True
        gc.freeze()
        if enabled:
            gc.enable()


def before_exit() -> None:
    """The interpreter's exit collects nothing mpskit made or imported (its files are written and closed)."""
    gc.freeze()
