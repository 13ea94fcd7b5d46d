"""The switch both lean paths share (lean logits, lean attention): whether the run asked for it, and
what ran, for mpskit.json ({"asked", "training": "lean" or the plain path's word, "fallbacks"}), with
one line on stderr the first time each fallback happens. The model types they run on are one table,
memory.LEAN_MODEL_TYPES, which the memory model plans with too."""

from __future__ import annotations

import sys


class LeanSwitch:
    name = ""  # what mpskit calls the path
    instead = ""  # what runs where it does not
    plain = ""  # the report's word for that, in training

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.report: dict = {"asked": enabled, "training": None, "fallbacks": []}

    def used(self, training: bool) -> None:
        if training and self.report["training"] is None:
            self.report["training"] = "lean"

    def fall_back(self, why: str, training: bool) -> None:
        if why not in self.report["fallbacks"]:
            self.report["fallbacks"].append(why)
            print(f"mpskit: {self.name} off for {why}; {self.instead} runs there", file=sys.stderr)
        if training and self.report["training"] is None:
            self.report["training"] = self.plain
