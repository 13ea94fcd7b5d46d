"""mpskit's own keys as docs/usage.md's key table and `mpskit train --help` state them. The settings'
defaults and help live on their fields (run_settings.RunSettings, knobs.OwnKnobs, foodpo.FooDPOConfig);
the keys that choose layers have no field, so their lines are here. No torch."""

from __future__ import annotations

from dataclasses import fields

from mpskit.settings.foodpo import FIELDS, FooDPOConfig
from mpskit.settings.knobs import OwnKnobs
from mpskit.settings.run_settings import RunSettings

LAYER_KEYS = (
    ("`preset`",
     "a stage preset of `configs/stages/` (or a YAML path) as the bottom layer, in a run file or as a word"),
    ("`model_preset`", "a file in `configs/models/` (model path or hub id, template, dimensions)"),
    ("`hardware` (or `--hardware`, `$MPSKIT_HARDWARE`)",
     "a profile in `configs/hardware/` or a YAML path; default: detect this machine"),
    ("`device`", "`auto` (default), `mps`, `cuda` or `cpu`; `cpu` on a Mac hides MPS from the training process"),
    ("`run_name`", "names `output/<run_name>/`; default `<stage>-<model>`"),
    ("`zero`", "`2` or `3`: DeepSpeed ZeRO with mpskit's config (`configs/deepspeed/ds_zN.json`), as `deepspeed` "
     "would name it; several processes, or one GPU"),
)  # fmt: skip


def own_settings() -> list[tuple[str, object, str]]:
    """(key, default, help) of each of mpskit's own settings, in the table's order."""
    keys = {name: key for key, name in FIELDS.items()}  # fooDPO's fields are named apart from their keys
    return [(keys.get(item.name, item.name), item.default, item.metadata["help"])
            for holder in (RunSettings, OwnKnobs, FooDPOConfig) for item in fields(holder)]  # fmt: skip


def stated(value: object) -> str:
    """A default as the table says it: `true`, `0.0`, unset."""
    if value is None:
        return "unset"
    return f"`{str(value).lower()}`" if isinstance(value, bool) else f"`{value}`"


def key_table() -> str:
    rows = [f"| {key} | {meaning} |" for key, meaning in LAYER_KEYS]
    rows += [f"| `{key}` | default {stated(default)}: {meaning} |" for key, default, meaning in own_settings()]
    return "\n".join(["| key | meaning |", "| --- | --- |", *rows])


def usage_words() -> str:
    """The settings for the command line's usage text: each key with its default."""
    return ", ".join(f"{key} (default {stated(default).strip('`')})" for key, default, _ in own_settings())
