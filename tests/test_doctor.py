"""`mpskit doctor`: MPS variable validation (unit) and the whole report on this CPU (real runs)."""

import pytest
from conftest import run_mpskit

from mpskit.machine.mps_env import watermark_problems


@pytest.mark.parametrize(
    ("environ", "valid"),
    [
        ({}, True),  # PyTorch's defaults: 1.7 and 1.4
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "1.17", "PYTORCH_MPS_LOW_WATERMARK_RATIO": "0.99"}, True),
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.8"}, False),  # seed 001: low stays 1.4 > 0.8
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "0.0"}, True),  # no cap; low 1.4 <= 2.0
        ({"PYTORCH_MPS_HIGH_WATERMARK_RATIO": "2.5", "PYTORCH_MPS_LOW_WATERMARK_RATIO": "1"}, False),
        ({"PYTORCH_MPS_LOW_WATERMARK_RATIO": "lots"}, False),
    ],
)
def test_watermark_rules(environ, valid):
    assert (watermark_problems(environ) == []) is valid


@pytest.mark.e2e
@pytest.mark.slow  # its runs are bench/memory_accuracy.py's quick cases; make test measures in test_real_memory
def test_doctor_reports_and_measures_on_this_cpu(tiny_model):
    result = run_mpskit("doctor", "--hardware", "cpu", "--model", str(tiny_model))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for needle in ("llamafactory", "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "valid together", "model load",
                   "NF4 round trip on cpu: works"):  # fmt: skip
        assert needle in out
    steps = [line for line in out.splitlines() if line.strip().startswith("step: cutoff_len")]
    assert len(steps) == 4
    for line in steps:
        estimate, measured = (float(word.rstrip("G")) for word in line.split()[-3:-1])
        assert estimate > 0 and measured > 0
    assert len([line for line in out.splitlines() if line.startswith("llamafactory ")]) == 1
    assert out.splitlines()[-1].startswith("verdict: ready to train on cpu")
