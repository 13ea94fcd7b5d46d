"""Environment variables a run needs, each with the reason, for `mpskit env` and `mpskit train`.

The MPS watermark ratios are fractions of Metal's recommendedMaxWorkingSetSize, not of RAM. The
allocator refuses low > high, so both are always exported. They are read at the first MPS
allocation, so they must be in the environment before torch touches the GPU.
"""

from __future__ import annotations

import math
import shlex

from mpskit.machine.hardware import Hardware

DEFAULT_HIGH_RATIO = 1.7  # PyTorch's default hard cap on unified memory
DEFAULT_LOW_RATIO = 1.4  # PyTorch's default soft limit on unified memory


def watermark_ratios(hw: Hardware) -> tuple[float, float]:
    """(high, low) so that high x recommended max stays below RAM minus macOS's headroom."""
    usable_gb = hw.ram_gb - hw.headroom_gb
    high = min(DEFAULT_HIGH_RATIO, usable_gb / hw.recommended_max_gb)
    high = math.floor(high * 100) / 100  # round down: the cap must stay below usable RAM
    low = math.floor(min(DEFAULT_LOW_RATIO, high * 0.85) * 100) / 100
    return high, low


def hard_cap_gb(hw: Hardware) -> float:
    return watermark_ratios(hw)[0] * hw.recommended_max_gb


def env_for(hw: Hardware) -> list[tuple[str, str, str]]:
    """(name, value, why) for this hardware."""
    env = [("TOKENIZERS_PARALLELISM", "false", "tokenizers' threads deadlock after the dataloader forks")]
    if hw.kind == "apple-silicon":
        high, low = watermark_ratios(hw)
        cap = high * hw.recommended_max_gb
        env += [
            (
                "PYTORCH_MPS_HIGH_WATERMARK_RATIO",
                f"{high:.2f}",
                f"hard cap {cap:.1f} GB = {high:.2f} x {hw.recommended_max_gb} GB recommended max, "
                f"below {hw.ram_gb} GB RAM minus {hw.headroom_gb} GB for macOS (default 1.7 would swap)",
            ),
            (
                "PYTORCH_MPS_LOW_WATERMARK_RATIO",
                f"{low:.2f}",
                "soft limit where MPS collects garbage; must be <= the high ratio or MPS fails to start",
            ),
            ("PYTORCH_ENABLE_MPS_FALLBACK", "1", "ops MPS lacks run on the CPU instead of failing"),
        ]
    return env


def env_values(hw: Hardware) -> dict[str, str]:
    """env_for's variables as name -> value: what a run exports and records."""
    return {name: value for name, value, _ in env_for(hw)}


def export_lines(hw: Hardware) -> str:
    lines = [f"# mpskit env for {hw.name} ({hw.kind}, {hw.ram_gb} GB)"]
    for name, value, why in env_for(hw):
        lines.append(f"# {why}")
        lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines)


HIGH_RATIO_UPPER_BOUND = 2.0  # MPSAllocator's default_high_watermark_upper_bound


def watermark_problems(environ: dict[str, str]) -> list[str]:
    """What PyTorch's MPS allocator would refuse in these variables, as it checks them at start-up:
    0 <= high <= 2.0, and 0 <= low <= high (or <= 2.0 when high is 0, which removes the cap)."""
    values = {}
    for name, default in (("HIGH", DEFAULT_HIGH_RATIO), ("LOW", DEFAULT_LOW_RATIO)):
        text = environ.get(f"PYTORCH_MPS_{name}_WATERMARK_RATIO")
        try:
            values[name] = default if text is None else float(text)
        except ValueError:
            return [f"PYTORCH_MPS_{name}_WATERMARK_RATIO={text!r} is not a number"]
    high, low = values["HIGH"], values["LOW"]
    problems = []
    if not 0.0 <= high <= HIGH_RATIO_UPPER_BOUND:
        problems.append(f"high watermark ratio {high} is outside 0..{HIGH_RATIO_UPPER_BOUND}")
    limit = high if high > 0 else HIGH_RATIO_UPPER_BOUND
    if not 0.0 <= low <= limit:
        problems.append(f"low watermark ratio {low} is above the high one ({high}): MPS fails to start")
    return problems
