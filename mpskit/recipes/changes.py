"""What mpskit wrote beside a user's own settings, said on screen and recorded.

A run with no stage preset is the user's LLaMA-Factory config: the written llamafactory.yaml differs
from it only by device rules, the planner's choices, the run folder and absolute paths. Each such key
is named here, once, so that nothing changes the meaning of a user's file without a word.
"""

from __future__ import annotations

import sys

from mpskit.settings.knobs import OWN_KEYS
from mpskit.settings.resolve import ResolvedRun


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def changed_keys(given: dict, written: dict) -> dict[str, list]:
    """key -> [the user's value, the written one] for every key that differs (None: not there).
    mpskit's own keys (lean paths) are not LLaMA-Factory's and never in the written file."""
    keys = [key for key in {**given, **written} if key not in OWN_KEYS]
    return {key: [given.get(key), written.get(key)] for key in keys if given.get(key) != written.get(key)}


def say_changes(run: ResolvedRun, written: dict) -> dict[str, list]:
    """Name on stderr the keys written beside the user's settings; {} when a stage preset was asked
    for (its values are the point, and `mpskit config` shows them all)."""
    if run.preset:
        return {}
    changed = changed_keys(run.given, written)
    groups = {"added": [], "changed": [], "left out": []}
    for key, (old, new) in changed.items():
        if old is None:
            groups["added"].append(f"{key}={_text(new)}")
        elif new is None:
            groups["left out"].append(key)
        else:
            groups["changed"].append(f"{key} {_text(old)} -> {_text(new)}")
    parts = [f"{name} {', '.join(items)}" for name, items in groups.items() if items]
    if parts:
        print(f"mpskit: beside your settings (device rules, planner, run folder): {'; '.join(parts)}", file=sys.stderr)
    return changed
