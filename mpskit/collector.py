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


@contextlib.contextmanager
def libraries_imported() -> Iterator[None]:
    """Within: no collection. After: everything made so far is out of every later collection. Nested
    uses collect nothing until the outermost ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def before_exit() -> None:
    """The interpreter's exit collects nothing mpskit made or imported (its files are written and closed)."""
    gc.freeze()
