import pytest
from conftest import run_mpskit

from mpskit.machine.hardware import load_hardware, profile_names
from mpskit.machine.mps_env import env_for, hard_cap_gb, watermark_ratios

APPLE = [n for n in profile_names() if load_hardware(n).kind == "apple-silicon"]


def exports(text: str) -> dict[str, str]:
    pairs = (line.removeprefix("export ").split("=", 1) for line in text.splitlines() if line.startswith("export "))
    return dict(pairs)


def test_m1_pro_exports_both_ratios_with_a_cap_below_ram():
    result = run_mpskit("env", "--hardware", "m1-pro-16gb")
    assert result.returncode == 0, result.stderr
    env = exports(result.stdout)
    high = float(env["PYTORCH_MPS_HIGH_WATERMARK_RATIO"])
    low = float(env["PYTORCH_MPS_LOW_WATERMARK_RATIO"])
    assert 0 < low <= high
    assert high * 10.67 < 16
    assert env["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    # every export line follows a comment line saying why
    lines = result.stdout.splitlines()
    assert all(lines[i - 1].startswith("# ") for i, line in enumerate(lines) if line.startswith("export "))


@pytest.mark.parametrize("name", APPLE)
def test_every_mac_profile_caps_below_ram_minus_headroom(name):
    hw = load_hardware(name)
    high, low = watermark_ratios(hw)
    assert 0 < low <= high <= 1.7
    assert hard_cap_gb(hw) <= hw.ram_gb - hw.headroom_gb


@pytest.mark.parametrize("name", ["cpu", "intel-mac", "cuda-24gb", "cuda-80gb"])
def test_non_mps_profiles_export_no_mps_variables(name):
    names = [n for n, _, _ in env_for(load_hardware(name))]
    assert not [n for n in names if "MPS" in n]
    assert "TOKENIZERS_PARALLELISM" in names
