import os

import pytest

from mpskit.errors import MpskitError
from mpskit.machine.allocator import EXACT, GLIBC_HEAP, UNMEASURED, this_c_library, trims_heap
from mpskit.machine.hardware import (
    Hardware,
    at_least,
    bf16_is_fast,
    bf16_supported,
    describe,
    detect,
    fp16_supported,
    load_hardware,
    profile_names,
)

REQUIRED_PROFILES = {
    "m1-8gb",
    "m1-pro-16gb",
    "m2-max-32gb",
    "m3-max-64gb",
    "m4-max-128gb",
    "intel-mac",
    "cpu",
    "cuda-24gb",
    "cuda-80gb",
}


def test_every_required_profile_loads():
    assert REQUIRED_PROFILES <= set(profile_names())
    for name in REQUIRED_PROFILES:
        hw = load_hardware(name)
        assert hw.name == name and hw.ram_gb > 0


def test_devices_follow_the_kind():
    assert load_hardware("m1-8gb").device == "mps"
    assert load_hardware("intel-mac").device == "cpu"
    assert load_hardware("cuda-24gb").device == "cuda"
    assert load_hardware("cpu").device == "cpu"


def test_the_allocator_follows_the_device_and_the_c_library():
    """machine/ names the allocator once; the plan's profile and the run's heap trims read that name."""
    assert load_hardware("cuda-24gb").allocator() == EXACT
    assert load_hardware("cpu").allocator() == GLIBC_HEAP  # a named Linux machine
    assert load_hardware("intel-mac").allocator() == UNMEASURED
    m1 = load_hardware("m1-8gb")
    assert m1.allocator() == m1.allocator("cpu") == UNMEASURED  # MPS, and macOS's CPU
    here = detect()
    assert here.c_library == this_c_library()
    assert trims_heap("cpu") == (here.allocator("cpu") == GLIBC_HEAP)
    assert not trims_heap("cuda") and not trims_heap("mps")


def mac(torch: str, macos: str, generation: int) -> Hardware:
    return Hardware(
        name="t", kind="apple-silicon", chip="M", ram_gb=16, chip_generation=generation, macos=macos, torch=torch
    )


@pytest.mark.parametrize(
    ("torch", "macos", "generation", "bf16", "fast", "fp16"),
    [
        ("2.5.1", "14.5", 3, False, False, False),  # bf16 needs torch 2.6
        ("2.6.0", "13.6", 3, False, False, False),  # ... and macOS 14
        ("2.6.0", "14.0", 3, True, True, False),  # fp16 training needs GradScaler (2.8)
        ("2.8.0", "14.5", 1, True, False, True),  # M1 emulates bf16: supported, not fast
        ("2.8.0", "15.0", 2, True, False, True),
        ("2.9.0", "15.0", 4, True, True, True),
    ],
)
def test_dtype_version_rules(torch, macos, generation, bf16, fast, fp16):
    hw = mac(torch, macos, generation)
    assert (bf16_supported(hw), bf16_is_fast(hw), fp16_supported(hw)) == (bf16, fast, fp16)


def test_intel_mac_says_why_in_detect_rows():
    rows = dict(describe(load_hardware("intel-mac")))
    assert "2.2.2" in rows["note"] and ">= 2.4" in rows["note"]


def test_unknown_profile_suggests_the_closest():
    with pytest.raises(MpskitError, match="did you mean 'm1-pro-16gb'"):
        load_hardware("m1-pro-16")


def test_detect_reports_this_machine():
    hw = detect(probe_torch=True)
    assert hw.kind in ("apple-silicon", "intel-mac", "cuda", "cpu")
    assert hw.ram_gb > 0 and hw.torch and hw.llamafactory == "0.9.5"


@pytest.mark.parametrize(
    ("smi_line", "bf16"),
    [("NVIDIA H100 80GB HBM3, 81559, 9.0", True), ("NVIDIA A100-SXM4-40GB, 40960, 8.0", True),
     ("Tesla T4, 15360, 7.5", False)],
)  # fmt: skip
def test_a_detected_cuda_machine_gets_bf16_from_its_compute_capability(smi_line, bf16, tmp_path, monkeypatch):
    """nvidia-smi says it, so no torch import and no CUDA initialised before a CPU run could hide it."""
    import platform

    from mpskit.settings.resolve import resolve

    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho '{smi_line}'\necho '{smi_line}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    hw = detect()
    assert (hw.kind, hw.gpu_count, hw.cuda_bf16) == ("cuda", 2, bf16)
    args = resolve({"stage": "sft", "model_preset": "tiny"}).args
    assert (args["bf16"], args["fp16"]) == (bf16, not bf16)


@pytest.mark.parametrize(
    ("version", "minimum", "enough"),
    [
        ("2.6.0rc1", "2.6", False),  # a pre-release comes before its release (digits alone read 2.6.0.1)
        ("2.6.0+cpu", "2.6", True),
        ("2.14.1+cu130", "2.6", True),
        ("14.5", "14", True),
        ("13.6.1", "14", False),
        (None, "2.4", False),
        ("unknown", "2.4", False),
    ],
)
def test_versions_are_compared_as_pip_orders_them(version, minimum, enough):
    assert at_least(version, minimum) is enough
