"""Run by every interpreter the tests start (conftest.py puts this folder on PYTHONPATH): the
test-only faults (faults.py), where the environment asks for one."""

import os

if any(name.startswith("MPSKIT_FAKE_") for name in os.environ):
    import faults  # noqa: F401 - installs itself
