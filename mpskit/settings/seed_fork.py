"""Stages and keys of the seed fork (1587causalai/llama_factory and its branches) that mpskit does not
take, each refused in one line with today's name or what to run instead.

The fork's `foodpo` branch defines fooDPO with `pref_beta_scale`, as mpskit does; its other branches
tried methods mpskit does not run (an adaptive beta schedule, DisCO, LEDPO), with keys of their own.
Read from the fork's hparams/finetuning_args.py on each branch. No torch import.
"""

from __future__ import annotations

from mpskit.errors import MpskitError

NOT_RUN = "which mpskit does not run"
FOODPO = "use stage: foodpo (beta scaled by the prompt's log-perplexity, pref_beta_scale) or stage: dpo"
STAGES = {
    "betadpo": f"stage betadpo is the seed fork's adaptive-beta DPO, {NOT_RUN}",
    "ledpo": f"stage ledpo is the seed fork's learned-beta DPO, {NOT_RUN}",
}
# key -> (what it was, what to write today)
KEYS = {
    "beta_min": ("the seed fork's betadpo lower clamp", "fooDPO clamps its beta with foodpo_beta_min"),
    "beta_max": ("the seed fork's betadpo upper clamp", "fooDPO clamps its beta with foodpo_beta_max"),
    "beta_strategy": (f"the seed fork's betadpo schedule, {NOT_RUN}", FOODPO),
    "use_dynamic_beta": ("the seed fork's switch for a dynamic beta", "write stage: foodpo with pref_beta_scale > 0"),
    "disco_pref": (f"the seed fork's DisCO preference loss, {NOT_RUN}", "leave it out"),
    "use_disco": (f"the seed fork's DisCO preference loss, {NOT_RUN}", "leave it out"),
    "disco_variance": (f"the seed fork's DisCO preference loss, {NOT_RUN}", "leave it out"),
}


def check_stage(stage: str) -> None:
    if stage in STAGES:
        raise MpskitError(STAGES[stage], FOODPO)


def check_keys(user: dict) -> None:
    for key in user:
        if key in KEYS:
            was, today = KEYS[key]
            raise MpskitError(f"{key} is {was}", today)
