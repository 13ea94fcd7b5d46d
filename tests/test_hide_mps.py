"""A CPU run on a machine with MPS must keep every tensor off MPS (seed 000).

Linux has no MPS, so the probe fakes one the way torch reports it, then asks LLaMA-Factory,
transformers and accelerate where they would put the model: two fresh interpreters that import them
(end to end: marked e2e).
"""

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(__name__)]

PROBE = """
import functools, sys
import torch

fake_mps = functools.lru_cache(lambda: True)
torch.backends.mps.is_available = fake_mps
torch.backends.mps.is_built = fake_mps
if sys.argv[1] == "hide":
    from mpskit.engine.bends import hide_accelerators
    hide_accelerators()

from accelerate.utils import is_mps_available
from llamafactory.extras.misc import get_current_device
from transformers.utils import is_torch_mps_available

print(get_current_device(), is_torch_mps_available(), is_mps_available())
"""


def probe(mode: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.fixture(scope="module")
def probes() -> dict[str, list[str]]:
    return {mode: probe(mode) for mode in ("fake", "hide")}


def test_the_fake_mps_fools_llamafactory(probes):
    # Without hiding, LLaMA-Factory would place the model on MPS: the fake is convincing.
    assert probes["fake"] == ["mps:0", "True", "True"]


def test_hiding_puts_everything_on_cpu(probes):
    assert probes["hide"] == ["cpu", "False", "False"]
