"""fooDPO's settings: DPO with a per-example beta scaled by the prompt's log-perplexity.

    beta_i = pref_beta * pref_beta_scale * log(max(PPL_i, 1))   when pref_beta_scale > 0
    beta_i = pref_beta                                          when pref_beta_scale = 0

LLaMA-Factory has no `foodpo` stage: the written YAML says `stage: foodpo` (so plain
`llamafactory-cli` refuses it instead of silently running DPO), and `mpskit train` turns it into
LLaMA-Factory's DPO workflow with the fooDPO trainer swapped in (see foodpo_trainer.py).
No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mpskit.errors import MpskitError
from mpskit.settings.validate import check_value

PPL_SOURCES = ("policy", "reference")
# LLaMA-Factory 0.9.5's pref_loss values. kto_pair is gone from trl 0.24's dpo_loss.
SUPPORTED_LOSSES = ("sigmoid", "hinge", "ipo", "orpo", "simpo")
NO_REFERENCE_LOSSES = ("orpo", "simpo")


@dataclass(frozen=True)
class FooDPOConfig:
    """fooDPO's settings, each with its one default."""

    pref_beta_scale: float = field(default=0.0, metadata={"help": (
        "`stage: foodpo` only, the scale of fooDPO's per-example beta; `0` is LLaMA-Factory's DPO "
        "(see [fooDPO](foodpo.md))")})  # fmt: skip
    beta_min: float | None = field(default=None, metadata={"help": "no lower clamp of fooDPO's beta"})
    beta_max: float | None = field(default=None, metadata={"help": "no upper clamp of fooDPO's beta"})
    ppl_source: str = field(default="policy", metadata={"help": (
        "whose prompt perplexity scales beta; `reference`: the reference model's")})  # fmt: skip


# the run file's key -> FooDPOConfig's field
FIELDS = {"pref_beta_scale": "pref_beta_scale", "foodpo_beta_min": "beta_min", "foodpo_beta_max": "beta_max",
          "foodpo_ppl_source": "ppl_source"}  # fmt: skip
FOODPO_KEYS = tuple(FIELDS)


def _number(args: dict, key: str) -> float | None:
    value = args.get(key)
    if value is None:
        return None
    check_value(key, value)
    return float(value)


def check_foodpo(args: dict) -> None:
    """A stage: foodpo run's own settings, checked (one line each) before anything loads."""
    if args.get("stage") == "foodpo":
        split_foodpo_args(args)


def split_foodpo_args(args: dict) -> tuple[dict, FooDPOConfig]:
    """(the DPO arguments LLaMA-Factory reads, fooDPO's own settings), checked."""
    lf_args = {key: value for key, value in args.items() if key not in FOODPO_KEYS}
    lf_args["stage"] = "dpo"
    loss = lf_args.get("pref_loss", "sigmoid")
    if loss not in SUPPORTED_LOSSES:
        raise MpskitError(
            f"pref_loss '{loss}' cannot take fooDPO's per-example beta (trl 0.24's DPO loss has no {loss})",
            f"use one of {', '.join(SUPPORTED_LOSSES)}",
        )
    source = args.get("foodpo_ppl_source", FooDPOConfig.ppl_source)
    if source not in PPL_SOURCES:
        raise MpskitError(f"foodpo_ppl_source is {source!r}", "use policy or reference")
    if source == "reference" and loss in NO_REFERENCE_LOSSES:
        raise MpskitError(
            f"foodpo_ppl_source: reference needs a reference model, which {loss} has none of", "use policy"
        )
    numbers = {
        name: _number(args, key) for key, name in FIELDS.items() if name != "ppl_source" and args.get(key) is not None
    }
    config = FooDPOConfig(**numbers, ppl_source=source)
    if config.beta_min is not None and config.beta_max is not None and config.beta_min > config.beta_max:
        raise MpskitError("foodpo_beta_min is above foodpo_beta_max", "swap them")
    return lf_args, config
