"""What machine a run is for: a named profile from configs/hardware/, or this machine, detected.

Nothing here imports torch unless asked to (`detect(probe_torch=True)`), so `mpskit env` and
`mpskit plan` stay fast.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from mpskit.errors import MpskitError, check_number
from mpskit.machine.allocator import GLIBC, allocator_for, this_c_library
from mpskit.machine.calibration import calibration_file, saved_figures
from mpskit.presets import config_dir, load_yaml, resolve_preset_file

KINDS = ("apple-silicon", "intel-mac", "cuda", "cpu")
INTEL_MAC_NOTE = (
    "Intel Mac: PyTorch's last macOS x86_64 wheel is torch 2.2.2 and LLaMA-Factory needs torch >= 2.4, "
    "so training here needs torch built from source (or a Linux/CUDA machine); mpskit uses CPU settings"
)


@dataclass
class Hardware:
    """Facts about one machine, plus the knobs its profile pins (`args`)."""

    name: str
    kind: str
    chip: str
    ram_gb: float
    chip_generation: int | None = None  # Apple silicon: 1 for M1, 2 for M2, ...
    macos: str | None = None
    torch: str | None = None
    transformers: str | None = None
    llamafactory: str | None = None
    mps_available: bool = False
    recommended_max_gb: float | None = None  # MPS recommendedMaxWorkingSetSize
    headroom_gb: float | None = None  # what macOS and other apps keep for themselves
    gpu_memory_gb: float | None = None
    gpu_count: int = 0
    cuda_bf16: bool = False  # compute capability >= 8.0
    flash_attn: bool = False  # FlashAttention-2 (flash-attn) installed there: the planner may offer fa2
    c_library: str | None = None  # "glibc" (Linux), or None (macOS): whose heap the CPU's tensors live in
    throughput: dict = field(default_factory=dict)  # flops_per_s, step_overhead_s, source, measured (duration.py)
    args: dict = field(default_factory=dict)
    source: str = "detected"

    @property
    def device(self) -> str:
        return {"apple-silicon": "mps", "cuda": "cuda"}.get(self.kind, "cpu")

    def allocator(self, device: str | None = None) -> str:
        """The allocator of a run on `device` (its own by default) here: machine/allocator.py's name."""
        return allocator_for(device or self.device, self.c_library)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def at_least(version: str | None, minimum: str) -> bool:
    """Version order as pip reads it (packaging): a pre-release comes before its release (2.6.0rc1 is
    not 2.6), a local tag counts as its release (2.6.0+cpu is). An unreadable version is not enough."""
    try:
        return version is not None and Version(version) >= Version(minimum)
    except InvalidVersion:
        return False


@functools.cache
def installed_version(package: str) -> str | None:
    """The installed version, read once a process (a plan loads a hardware profile for each machine it
    weighs; each read parses the package's metadata)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def default_recommended_max_gb(ram_gb: float) -> float:
    """Metal's recommendedMaxWorkingSetSize: about 2/3 of RAM up to 32 GB, about 3/4 from 36 GB."""
    return round(ram_gb * (2 / 3 if ram_gb <= 32 else 3 / 4), 2)


def default_headroom_gb(ram_gb: float) -> float:
    """RAM left to macOS and open apps: at least 3 GB, 15% of larger machines."""
    return round(max(3.0, 0.15 * ram_gb), 2)


def bf16_supported(hw: Hardware) -> bool:
    if hw.kind == "cuda":
        return hw.cuda_bf16
    if hw.kind == "apple-silicon":
        return at_least(hw.macos, "14") and at_least(hw.torch, "2.6")
    return False


def fp16_supported(hw: Hardware) -> bool:
    """Mixed-precision fp16 training needs autocast (torch 2.5) and its GradScaler (torch 2.8) on MPS."""
    if hw.kind == "cuda":
        return True
    if hw.kind == "apple-silicon":
        return at_least(hw.torch, "2.8")
    return False


def bf16_is_fast(hw: Hardware) -> bool:
    """Whether 16-bit compute is faster than float32: on Ampere and newer GPUs, and from M3 on. M1/M2
    emulate bf16: their runs stay in float32 unless the planner needs bf16's half memory to fit."""
    if hw.kind == "apple-silicon":
        return bf16_supported(hw) and (hw.chip_generation or 0) >= 3
    return bf16_supported(hw)


def hardware_notes(hw: Hardware) -> list[str]:
    notes = []
    if hw.kind == "intel-mac":
        notes.append(INTEL_MAC_NOTE)
    if hw.kind == "apple-silicon" and not at_least(hw.torch, "2.4"):
        notes.append(f"torch {hw.torch} is older than the 2.4 LLaMA-Factory needs; pip install -U torch")
    return notes


# What each fact of a profile must be: numbers (an errors.in_range kind and floor), text, switches.
NUMBER_FACTS = {
    "ram_gb": ("positive", 0),
    "recommended_max_gb": ("positive", 0),
    "headroom_gb": ("number", 0),
    "gpu_memory_gb": ("positive", 0),
    "gpu_count": ("int", 0),
    "chip_generation": ("int", 1),
}
TEXT_FACTS = ("kind", "chip", "macos", "torch", "transformers", "llamafactory")
SWITCH_FACTS = ("mps_available", "cuda_bf16", "flash_attn")


def _check_facts(data: dict, source: str) -> None:
    for key, (kind, low) in NUMBER_FACTS.items():
        if data.get(key) is not None or key == "ram_gb":
            check_number(f"hardware profile {source}: {key}", data[key], kind, low, fix=f"write {key} as such a number")
    for key in TEXT_FACTS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise MpskitError(f"hardware profile {source}: {key}={value!r} is not text", f"quote it: {key}: '{value}'")
    for key in SWITCH_FACTS:
        if key in data and not isinstance(data[key], bool):
            raise MpskitError(f"hardware profile {source}: {key}={data[key]!r} is not a switch", "write true or false")
    check_throughput(data.get("throughput"), f"hardware profile {source}: throughput")


# duration.Throughput's figures and the ranges a real device's fall in (a figure outside is a typo or a
# damaged file, and would plan nonsense or divide by zero); the work ratios are positive, the others may be 0
FIGURE_RANGES = {"flops_per_s": ("positive", 0, 1e17), "step_overhead_s": ("number", 0, 60),
                 "half_work": ("positive", 0, 100), "half_layer_s": ("number", 0, 10),
                 "quantized_weight_s": ("number", 0, 1e-3), "quantized_work": ("positive", 0, 100)}  # fmt: skip
OPTIONAL_FIGURES = ("half_work", "half_layer_s", "quantized_weight_s", "quantized_work")
WORK_RATIOS = ("half_work", "quantized_work")
THROUGHPUT_FIX = "write throughput: {flops_per_s: 1.5e12, step_overhead_s: 0.05, source: 'how you know them'}"


def check_throughput(figures, where: str, fix: str = THROUGHPUT_FIX) -> None:
    """flops_per_s, step_overhead_s and source are required; measured and the figures measured for 16-bit
    checkpoints and 4-bit bases are optional (duration.py). Each figure within FIGURE_RANGES. WHERE
    names the file and key, FIX what to do."""
    if figures is None:
        return
    if not isinstance(figures, dict) or not {"flops_per_s", "step_overhead_s", "source"} <= set(figures):
        raise MpskitError(f"{where} needs flops_per_s, step_overhead_s and source", fix)
    unknown = sorted(set(figures) - {"flops_per_s", "step_overhead_s", "source", "measured", *OPTIONAL_FIGURES})
    if unknown:
        raise MpskitError(f"{where} has unknown key(s) {', '.join(unknown)}", fix)
    for key, (kind, low, high) in FIGURE_RANGES.items():
        if key in figures:
            check_number(f"{where}.{key}", figures[key], kind, low, high, fix=fix)
    if not isinstance(figures.get("measured", False), bool):
        raise MpskitError(f"{where}.measured={figures['measured']!r} is not a switch", "write true or false")


def _from_mapping(data: dict, name: str, source: str) -> Hardware:
    known = {f.name for f in dataclasses.fields(Hardware)}
    unknown = sorted(set(data) - known - {"description"})
    if unknown:
        raise MpskitError(
            f"hardware profile {source} has unknown key(s) {', '.join(unknown)}",
            f"use only {', '.join(sorted(known - {'name', 'source'}))}",
        )
    for required in ("kind", "chip", "ram_gb"):
        if required not in data:
            raise MpskitError(f"hardware profile {source} lacks '{required}'", f"add '{required}:' to it")
    if data["kind"] not in KINDS:
        raise MpskitError(f"hardware profile {source} has kind '{data['kind']}'", f"use one of {', '.join(KINDS)}")
    _check_facts(data, source)
    values = {k: v for k, v in data.items() if k != "description"}
    values.setdefault("name", name)
    values.setdefault("c_library", GLIBC if data["kind"] in ("cpu", "cuda") else None)  # a named Linux machine
    hw = Hardware(source=source, **values)
    hw.torch = hw.torch or installed_version("torch")
    hw.transformers = hw.transformers or installed_version("transformers")
    hw.llamafactory = hw.llamafactory or installed_version("llamafactory")
    if hw.kind == "apple-silicon":
        hw.mps_available = data.get("mps_available", True)
        hw.recommended_max_gb = hw.recommended_max_gb or default_recommended_max_gb(hw.ram_gb)
    if hw.kind in ("apple-silicon", "intel-mac", "cpu"):
        hw.headroom_gb = hw.headroom_gb if hw.headroom_gb is not None else default_headroom_gb(hw.ram_gb)
    if not isinstance(hw.args, dict):
        raise MpskitError(f"hardware profile {source} has 'args' that is not a mapping", "write args: {key: value}")
    return hw


def profile_names() -> list[str]:
    return sorted(p.stem for p in (config_dir() / "hardware").glob("*.yaml"))


def load_hardware(name_or_path: str) -> Hardware:
    path = resolve_preset_file("hardware", name_or_path)
    return _from_mapping(load_yaml(path), path.stem, str(path))


def _sysctl(key: str) -> str | None:
    if not shutil.which("sysctl"):
        return None
    out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None


def nvidia_gpus() -> list[tuple[str, float, float | None]]:
    """(name, memory in GB, compute capability) of each NVIDIA GPU, from nvidia-smi: no torch import,
    so CUDA is not initialised before mpskit may hide it. The capability needs a driver from 2022 on."""
    if not shutil.which("nvidia-smi"):
        return []
    for fields in ("name,memory.total,compute_cap", "name,memory.total"):
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode == 0:
            break
    gpus = []
    for line in out.stdout.strip().splitlines():
        name, mib, *cap = (part.strip() for part in line.split(","))
        gpus.append((name, round(float(mib) / 1024, 1), float(cap[0]) if cap else None))
    return gpus


def _apple_generation(chip: str) -> int | None:
    for word in chip.split():
        if len(word) >= 2 and word[0] == "M" and word[1:].isdigit():
            return int(word[1:])
    return None


def _cpu_model() -> str | None:
    """Linux's name for the processor (/proc/cpuinfo's model name), where it gives one."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def detect(probe_torch: bool = False) -> Hardware:
    """Describe this machine. With probe_torch, ask torch about MPS/CUDA (slow: imports torch)."""
    import psutil

    ram_gb = round(psutil.virtual_memory().total / 1024**3, 1)
    system, machine = platform.system(), platform.machine()
    data: dict = {"ram_gb": ram_gb, "c_library": this_c_library()}
    if system == "Darwin":
        data["macos"] = platform.mac_ver()[0]
        chip = _sysctl("machdep.cpu.brand_string") or machine
        data["chip"] = chip
        if machine == "arm64":
            data.update(kind="apple-silicon", chip_generation=_apple_generation(chip))
        else:
            data["kind"] = "intel-mac"
    else:
        gpus = nvidia_gpus()
        if gpus:
            name, memory_gb, capability = gpus[0]
            data.update(kind="cuda", chip=name, gpu_memory_gb=memory_gb, gpu_count=len(gpus))
            data["cuda_bf16"] = capability is not None and capability >= 8.0  # Ampere and newer
            data["flash_attn"] = installed_version("flash-attn") is not None
        else:
            data.update(kind="cpu", chip=_cpu_model() or platform.processor() or machine)
    figures = saved_figures(data["kind"], data["chip"])  # `mpskit calibrate`'s, for this machine
    if figures:
        fix = f"remove {calibration_file()}, then run `mpskit calibrate` again (or plan without it)"
        check_throughput(figures, f"{calibration_file()}: throughput", fix)
        data["throughput"] = figures
    hw = _from_mapping(data, "detected", "this machine")
    if probe_torch:
        _probe_torch(hw)
    return hw


def _probe_torch(hw: Hardware) -> None:
    import torch

    if hw.kind == "apple-silicon":
        hw.mps_available = torch.backends.mps.is_available()
        if hw.mps_available and hasattr(torch.mps, "recommended_max_memory"):  # torch >= 2.5
            hw.recommended_max_gb = round(torch.mps.recommended_max_memory() / 1024**3, 2)
    if hw.kind == "cuda" and torch.cuda.is_available():
        hw.cuda_bf16 = torch.cuda.is_bf16_supported()


def select_hardware(name: str | None = None, probe_torch: bool = False) -> Hardware:
    """--hardware NAME|FILE, else $MPSKIT_HARDWARE, else this machine."""
    choice = name or os.environ.get("MPSKIT_HARDWARE")
    return load_hardware(choice) if choice else detect(probe_torch=probe_torch)


def describe(hw: Hardware) -> list[tuple[str, str]]:
    """Rows for `mpskit detect`."""
    rows = [
        ("profile", f"{hw.name} ({hw.source})"),
        ("kind", hw.kind),
        ("chip", hw.chip),
        ("ram", f"{hw.ram_gb} GB"),
        ("device", hw.device),
    ]
    if hw.macos:
        rows.append(("macos", hw.macos))
    if hw.kind == "apple-silicon":
        rows.append(("mps available", str(hw.mps_available)))
        rows.append(("recommended max (MPS)", f"{hw.recommended_max_gb} GB"))
    if hw.kind == "cuda":
        rows.append(("gpus", f"{hw.gpu_count} x {hw.gpu_memory_gb} GB"))
    rows += [
        ("bf16", f"supported={bf16_supported(hw)} fast={bf16_is_fast(hw)}"),
        ("fp16", f"supported={fp16_supported(hw)}"),
        ("torch", str(hw.torch)),
        ("transformers", str(hw.transformers)),
        ("llamafactory", str(hw.llamafactory)),
    ]
    rows += [("note", note) for note in hardware_notes(hw)]
    return rows
