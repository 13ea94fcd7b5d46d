"""The command line of a new mpskit process (the out-of-memory re-exec, a probe, the demo's stages) that
imports what this one imports. No torch import.

`python -m mpskit.cli` would put the working folder first on the import path: a user's `datasets.py`
or `yaml.py` there would be imported in place of the library. The new process starts with `-P` (no
such folder) and takes this process's `sys.path` whole, so it sees the same modules as the first.
"""

from __future__ import annotations

import sys

BOOT = (
    "import sys; sys.path[:] = sys.argv[1].split('\\n'); sys.argv[:2] = ['mpskit']; "
    "from mpskit.cli import main; sys.exit(main())"
)


def mpskit_command(*words: str) -> list[str]:
    """`mpskit WORDS` as an argument list for exec or subprocess."""
    return [sys.executable, "-P", "-c", BOOT, "\n".join(sys.path), *words]
