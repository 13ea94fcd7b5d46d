"""mpskit's own settings of a run that are no knob: what the planner may spend and shorten, what an
out-of-memory error may move, whether the Mac stays awake. None reaches LLaMA-Factory. Each default is
written once, here; `read_run_settings` checks the words or keys that set them. (The knobs mpskit adds,
lean_logits and lean_attention, live with the other knobs: knobs.OWN_KEYS.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpskit.errors import MpskitError
from mpskit.settings.knobs import DEFAULT_CUTOFF_FLOOR, OOM_LADDER
from mpskit.settings.validate import check_value


@dataclass(frozen=True)
class RunSettings:
    memory_budget_gb: float | None = field(default=None, metadata={"help": (
        "the budget the hardware gives; a number: the memory the run may add")})  # fmt: skip
    min_cutoff_len: int = field(default=DEFAULT_CUTOFF_FLOOR, metadata={"help": (
        "how far the planner (and the out-of-memory ladder) may shorten `cutoff_len` when nothing fits")})  # fmt: skip
    oom_ladder: str | None = field(default=None, metadata={"help": (
        "an out-of-memory error changes LoRA rank or `cutoff_len` only where you left them free; `keep`: never; "
        "`adapt`: even where you wrote them")})  # fmt: skip
    keep_awake: bool = field(default=True, metadata={"help": (
        "on macOS the Mac stays awake while the run trains (`caffeinate`); `false` lets it sleep")})  # fmt: skip


def read_run_settings(own: dict) -> RunSettings:
    """The settings as a run file or words give them (OWN: their keys), checked; the rest default."""
    given = {}
    for key, kind in (("memory_budget_gb", float), ("min_cutoff_len", int)):
        if key in own:
            check_value(key, own[key])
            given[key] = kind(own[key])
    ladder = own.get("oom_ladder")
    if ladder is not None and ladder not in OOM_LADDER:
        raise MpskitError(
            f"oom_ladder={ladder!r} is not keep or adapt",
            "keep: never change LoRA rank or cutoff_len on out of memory; adapt: change them if need be",
        )
    awake = own.get("keep_awake", RunSettings.keep_awake)
    if not isinstance(awake, bool):
        raise MpskitError(f"keep_awake={awake!r} is not true or false", "write keep_awake=true or keep_awake=false")
    return RunSettings(**given, oom_ladder=ladder, keep_awake=awake)
