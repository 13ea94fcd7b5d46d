"""Quantized bases (QLoRA) through bitsandbytes: which settings train, and where.

bitsandbytes 0.50.2 and newer quantize to 4 bits (NF4 with double quantization, LLaMA-Factory's
defaults) and to 8 bits on MPS and on the CPU as on CUDA; it has wheels for Linux and for macOS 14+
on Apple silicon, none for older macOS or Intel Macs. Its 8-bit optimizers run on CUDA and the CPU,
not on MPS yet. The other methods LLaMA-Factory names do not train here: HQQ fails under
transformers 5.6 ("not available yet"), EETQ is built for CUDA. A model already quantized by GPTQ,
AWQ or AQLM needs those CUDA kernels. No torch.
"""

from __future__ import annotations

import platform
from pathlib import Path

from packaging.version import Version

from mpskit.errors import MpskitError
from mpskit.files import read_json
from mpskit.machine.hardware import Hardware, installed_version
from mpskit.settings.knobs import own_settings, zero_stage_of

BITS = (4, 8)
METHOD = "bnb"  # LLaMA-Factory's name for bitsandbytes
ADAPTERS = ("lora", "oft")  # what LLaMA-Factory trains on a quantized base
MIN_BITSANDBYTES = {"cuda": "0.39.0", "mps": "0.50.2", "cpu": "0.50.2"}  # its MPS and CPU 4-bit backends
CUDA_KERNEL_METHODS = ("gptq", "awq", "aqlm", "eetq")


def has_build(hw: Hardware) -> bool:
    """Whether bitsandbytes has a wheel for this machine: not for Intel Macs, nor for Apple silicon
    before macOS 14 (the planner quantizes only where a run can)."""
    if hw.kind == "intel-mac":
        return False
    major = str(hw.macos or "").split(".")[0]
    return not (hw.kind == "apple-silicon" and major.isdigit() and int(major) < 14)


def eight_bit_optimizer(args: dict) -> bool:
    return "8bit" in str(args.get("optim", ""))


def uses_bitsandbytes(args: dict) -> bool:
    return args.get("quantization_bit") is not None or eight_bit_optimizer(args)


def check_settings(args: dict) -> None:
    """What fails on every device: other bit widths and methods, full fine-tuning of a quantized base,
    8 bits under DeepSpeed ZeRO-3 (LLaMA-Factory shards 4-bit bases only)."""
    bits = args.get("quantization_bit")
    method = str(args.get("quantization_method", METHOD))
    _check_packed_vocabulary(args)
    if bits is None:
        return
    if bits not in BITS:
        raise MpskitError(f"quantization_bit={bits!r}: bitsandbytes quantizes to 4 bits (NF4) or 8", "set 4 or 8")
    if method.lower() == "bitsandbytes":
        raise MpskitError(
            f"quantization_method={method} is not a LLaMA-Factory value: it calls bitsandbytes '{METHOD}'",
            f"write quantization_method={METHOD}, or leave it out ({METHOD} is the default)",
        )
    if method != METHOD:
        raise MpskitError(
            f"quantization_method={method}: mpskit quantizes with bitsandbytes (HQQ fails under transformers 5.6, "
            "EETQ needs CUDA)",
            f"leave quantization_method out (it is {METHOD}, bitsandbytes)",
        )
    finetuning = str(args.get("finetuning_type", "lora"))
    if finetuning not in ADAPTERS:
        raise MpskitError(
            f"finetuning_type={finetuning} with quantization_bit={bits}: a quantized base trains adapters only",
            "set finetuning_type=lora, or leave quantization_bit out to train the 16-bit weights",
        )
    if bits == 8 and zero_stage_of(args.get("deepspeed")) >= 3:
        raise MpskitError(
            "quantization_bit=8 under DeepSpeed ZeRO-3: LLaMA-Factory shards 4-bit bases only",
            "set quantization_bit=4, or ZeRO-2",
        )


VOCAB_MODULES = ("embed_tokens", "lm_head")


def _check_packed_vocabulary(args: dict) -> None:
    """quantize_embeddings packs the embeddings and the output layer in the base's bits, frozen: it needs
    a quantized base, and nothing may train or resize them."""
    if own_settings(args).quantize_embeddings is not True:
        return
    if args.get("quantization_bit") is None:
        raise MpskitError("quantize_embeddings=true packs the embeddings in the base's bits, and the base is 16-bit",
                          "set quantization_bit=4 (or 8), or leave quantize_embeddings out")  # fmt: skip
    for key in ("lora_target", "additional_target"):
        named = [name.strip() for name in str(args.get(key) or "").split(",") if name.strip() in VOCAB_MODULES]
        if named:
            raise MpskitError(f"{key} names {', '.join(named)}, which quantize_embeddings=true packs and freezes",
                              f"take {', '.join(named)} out of {key}, or leave quantize_embeddings out")  # fmt: skip
    if args.get("resize_vocab") is True:
        raise MpskitError("resize_vocab=true grows the embeddings, which quantize_embeddings=true packs and freezes",
                          "leave one of them out")  # fmt: skip


def pre_quantized_method(model: str) -> str | None:
    """The quant_method of a local model's config.json (a model saved already quantized), else None."""
    config = Path(model).expanduser() / "config.json"
    try:
        quantization = read_json(config).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(quantization, dict):
        return None
    return str(quantization.get("quant_method", "")).lower() or None


def device_problems(args: dict, device: str, hw: Hardware | None = None) -> list[tuple[str, str]]:
    """(problem, fix) for what does not run on this device: bitsandbytes missing or too old for it, or
    without a build for the profile HW (an Intel Mac, macOS 13), its 8-bit optimizers on MPS, a base
    saved with GPTQ, AWQ or AQLM off CUDA."""
    problems = []
    if hw is not None and uses_bitsandbytes(args) and not has_build(hw):
        key = "quantization_bit" if args.get("quantization_bit") is not None else "optim"
        problems.append((
            f"{key}={args[key]}: bitsandbytes has no build for '{hw.name}' (it needs macOS 14 on Apple silicon)",
            f"leave {key} out for that machine",
        ))  # fmt: skip
    elif missing := _bitsandbytes_problem(args, device):
        problems.append(missing)
    if device == "mps" and eight_bit_optimizer(args):
        problems.append((
            f"optim={args['optim']}: bitsandbytes' 8-bit optimizers do not run on MPS yet",
            "leave optim out (adamw_torch), or train on the CPU or CUDA",
        ))  # fmt: skip
    method = pre_quantized_method(str(args.get("model_name_or_path", "")))
    if device != "cuda" and method in CUDA_KERNEL_METHODS:
        problems.append((
            f"the model is saved {method.upper()}-quantized, which needs CUDA kernels; this run is on {device}",
            "train its 16-bit base with quantization_bit=4 (bitsandbytes runs here)",
        ))  # fmt: skip
    return problems


def _bitsandbytes_problem(args: dict, device: str) -> tuple[str, str] | None:
    """(problem, fix) when the run needs bitsandbytes and this machine lacks a recent enough one."""
    if not uses_bitsandbytes(args):
        return None
    need = MIN_BITSANDBYTES[device]
    have = installed_version("bitsandbytes")
    key = "quantization_bit" if args.get("quantization_bit") is not None else "optim"
    if have is not None and Version(have) >= Version(need):
        return None
    found = f"{have} is installed" if have else "it is not installed"
    problem = f"{key}={args[key]} needs bitsandbytes >= {need} on {device.upper()}; {found}"
    return problem, _install_fix(need)


def _install_fix(need: str) -> str:
    """Where bitsandbytes has a wheel, how to install it; where it has none, what to do instead."""
    darwin = platform.release().split(".")[0] if platform.system() == "Darwin" else ""
    if darwin and (platform.machine() != "arm64" or not darwin.isdigit() or int(darwin) < 23):  # 23: macOS 14
        return "bitsandbytes has no build for this Mac (it needs macOS 14 on Apple silicon): leave quantization out"
    return f"pip install 'bitsandbytes>={need}' (make install does), or leave quantization out"
