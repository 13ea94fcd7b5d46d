"""The cycle collector pauses over the libraries' first import and then leaves their objects out of
every walk (collector.py); later uses leave it alone, so nothing a run made later is frozen."""

import subprocess
import sys

from conftest import ROOT

FIRST_AND_LATER = """
import gc
from mpskit.collector import libraries_imported

with libraries_imported():
    assert not gc.isenabled()
    with libraries_imported():  # nested: still no collection
        assert not gc.isenabled()
    assert not gc.isenabled()
frozen = gc.get_freeze_count()
assert gc.isenabled() and frozen > 0
cycle = []
cycle.append(cycle)  # the run's own garbage
with libraries_imported():
    assert gc.isenabled()
assert gc.get_freeze_count() == frozen
"""


def test_the_first_import_freezes_the_libraries_and_later_uses_freeze_nothing():
    done = subprocess.run([sys.executable, "-c", FIRST_AND_LATER], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
