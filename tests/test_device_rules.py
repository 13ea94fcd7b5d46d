"""Where a user value cannot work on the run's device, mpskit refuses it in one line before anything is
made, or corrects it with a one-line warning."""

import importlib.util
import json
import os

import pytest
from conftest import run_mpskit

from mpskit.settings.resolve import resolve


@pytest.fixture
def fake_cuda_machine(tmp_path):
    """An nvidia-smi on PATH that reports one A100, so `train` takes this for a CUDA machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA A100-SXM4-80GB, 81920, 8.0'\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def base(tiny_model) -> list[str]:
    return ["train", "preset=sft", "model_preset=tiny", f"model_name_or_path={tiny_model}", "max_steps=1"]


@pytest.mark.parametrize(
    "words, package, extra",
    [
        (["enable_liger_kernel=true"], "liger_kernel", "cuda"),
    ],
)
def test_cuda_options_without_their_package_are_refused_before_the_run_folder(
    words, package, extra, tiny_model, tmp_path, fake_cuda_machine
):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here: nothing to refuse")
    work = tmp_path / "work"
    work.mkdir()
    result = run_mpskit(*base(tiny_model), *words, "--hardware", "cuda-80gb", cwd=work, env=fake_cuda_machine)
    lines = [line for line in result.stderr.splitlines() if "warning" not in line]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and f"needs the {package} package" in lines[0] and f"mpskit[{extra}]" in lines[0]
    assert list(work.iterdir()) == []  # no output/, no run folder


@pytest.mark.parametrize(
    "device, installed, words, needle",
    [
        ("cpu", None, ["quantization_bit=4"], "quantization_bit=4 needs bitsandbytes >= 0.50.2 on CPU; it is not"),
        ("mps", "0.45.0", ["quantization_bit=8"], "needs bitsandbytes >= 0.50.2 on MPS; 0.45.0 is installed"),
        ("cpu", "0.49.1", ["optim=adamw_8bit"], "optim=adamw_8bit needs bitsandbytes >= 0.50.2 on CPU"),
        ("cuda", "0.38.0", ["quantization_bit=4"], "needs bitsandbytes >= 0.39.0 on CUDA"),
        ("mps", "0.50.2", ["optim=paged_adamw_8bit"], "8-bit optimizers do not run on MPS yet"),
    ],
)  # fmt: skip
def test_bitsandbytes_missing_too_old_or_not_on_this_device_is_one_line(device, installed, words, needle, monkeypatch):
    from mpskit.settings import quantization

    monkeypatch.setattr(quantization, "installed_version", lambda package: installed)
    args = dict(word.split("=") for word in words)
    args = {key: int(value) if value.isdigit() else value for key, value in args.items()}
    problems = quantization.device_problems(args, device)
    assert len(problems) == 1 and needle in problems[0][0], problems
    assert "leave" in problems[0][1]  # and the fix: install it, or leave the option out


def test_a_mac_without_a_bitsandbytes_build_is_told_so(monkeypatch):
    from mpskit.settings import quantization

    monkeypatch.setattr(quantization, "installed_version", lambda package: None)
    for machine, release in (("arm64", "22.6.0"), ("x86_64", "23.1.0")):  # macOS 13 on Apple silicon, an Intel Mac
        monkeypatch.setattr(quantization.platform, "system", lambda: "Darwin")
        monkeypatch.setattr(quantization.platform, "machine", lambda machine=machine: machine)
        monkeypatch.setattr(quantization.platform, "release", lambda release=release: release)
        ((problem, fix),) = quantization.device_problems({"quantization_bit": 4}, "cpu")
        assert "no build for this Mac" in fix and "macOS 14" in fix


@pytest.mark.parametrize(
    "words, needle",
    [
        (["enable_liger_kernel=true"], "Liger's kernels are Triton"),
        (["fsdp=full_shard"], "accelerate would drop it and train plain DDP"),
    ],
)
def test_cuda_only_options_off_cuda_are_refused_before_the_run_folder(words, needle, tiny_model, tmp_path):
    (tmp_path / "ds.json").write_text("{}")
    result = run_mpskit(*base(tiny_model), *words, "--hardware", "cpu", cwd=tmp_path)
    lines = result.stderr.strip().splitlines()  # the refusal alone, not a note that says it first
    assert result.returncode == 2 and len(lines) == 1 and needle in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json"]
    config = run_mpskit("config", *base(tiny_model)[1:], *words, "--hardware", "cpu", cwd=tmp_path)
    assert config.returncode == 0 and "this config is for a CUDA machine" in config.stderr


def test_bf16_where_macos_lacks_it_becomes_fp32_with_a_warning(capsys, tmp_path):
    profile = tmp_path / "m1-macos13.yaml"
    profile.write_text("kind: apple-silicon\nchip: Apple M1\nram_gb: 16\nmacos: '13.6'\n")
    args = resolve({"stage": "sft", "model_preset": "qwen2.5-0.5b", "bf16": True}, hardware=str(profile)).args
    assert args["bf16"] is False and args["fp16"] is False
    assert "bf16 does not run on m1-macos13" in capsys.readouterr().err
    args = resolve({"stage": "sft", "model_preset": "qwen2.5-0.5b", "bf16": True}, hardware="m1-pro-16gb").args
    assert args["bf16"] is True  # macOS 14 runs it on an M1 too (emulated: slower, half the memory)


def test_the_planner_offers_qlora_where_bitsandbytes_builds():
    """A 3B model in 6 GB: no 16-bit setting fits; a 4-bit base does on an Apple-silicon Mac and on
    CUDA, and an Intel Mac (no bitsandbytes build) is told it does not fit."""
    words = ["preset=sft", "model_preset=qwen2.5-3b", "memory_budget_gb=6", "--json"]
    mac = run_mpskit("plan", *words, "--hardware", "m1-8gb")
    cuda = run_mpskit("plan", *words, "--hardware", "cuda-24gb")
    intel = run_mpskit("plan", *words, "--hardware", "intel-mac")
    assert (mac.returncode, cuda.returncode, intel.returncode) == (0, 0, 3)
    for result in (mac, cuda):
        assert json.loads(result.stdout)["chosen"]["knobs"]["quantization_bit"] == 4
    assert "quantization_bit=4" not in intel.stdout and '"quantization_bit": 4' not in intel.stdout


def test_a_4_bit_base_asked_for_a_mac_bitsandbytes_does_not_build_for_is_said_there(tmp_path, capsys):
    """plan and config for an Intel Mac or macOS 13 with quantization_bit=4 say, on one line, that it will
    not run there (as they say of CUDA-only options); the profiles that build it say nothing."""
    from mpskit.cli import main

    profile = tmp_path / "m1-macos13.yaml"
    profile.write_text("kind: apple-silicon\nchip: Apple M1\nram_gb: 16\nmacos: '13.6'\n")
    words = ["preset=sft", "model_preset=qwen2.5-0.5b", "quantization_bit=4"]
    for hardware, name in (("intel-mac", "intel-mac"), (str(profile), "m1-macos13")):
        for command in (["plan", *words], ["config", *words, "-o", str(tmp_path / f"run-{name}.yaml")]):
            assert main([*command, "--hardware", hardware]) == 0
            said = capsys.readouterr().err
            assert f"quantization_bit=4: bitsandbytes has no build for '{name}'" in said, said
    assert main(["plan", *words, "--hardware", "m1-pro-16gb"]) == 0
    assert "no build" not in capsys.readouterr().err
