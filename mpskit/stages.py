"""The training stages mpskit runs, and what each one is, in one table. Every module that asks
something of a stage asks it here. No imports beyond the standard library.

(LLaMA-Factory's `ppo` is not among them: resolve.py refuses it with the command that runs it.)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    rows: str  # what a dataset row holds: "text" (pt), "answer" (sft), "pairs" (chosen, rejected), "kto"
    planned: bool  # memory.py models it: `mpskit plan` and the planner choose its knobs
    lean: bool  # mpskit's trainers run it: lean logits and lean attention where they apply
    reference_model: bool  # scores against a frozen reference model (the base, LoRA switched off)

    @property
    def pairs(self) -> bool:
        """Each example is a chosen and a rejected answer: two sequences a step per example."""
        return self.rows == "pairs"


# Every stage saves checkpoints that appear only when complete and resumes exactly (resumable.py).
STAGES = {
    "pt": Stage(rows="text", planned=False, lean=False, reference_model=False),
    "sft": Stage(rows="answer", planned=True, lean=True, reference_model=False),
    "rm": Stage(rows="pairs", planned=False, lean=False, reference_model=False),
    "dpo": Stage(rows="pairs", planned=True, lean=True, reference_model=True),
    "kto": Stage(rows="kto", planned=False, lean=False, reference_model=True),
    "foodpo": Stage(rows="pairs", planned=True, lean=True, reference_model=True),
}
PLANNED = tuple(name for name, stage in STAGES.items() if stage.planned)
UNKNOWN = Stage(rows="answer", planned=False, lean=False, reference_model=False)  # resolve.py refuses it


def stage_of(name: object) -> Stage:
    """The table's entry for a stage name (UNKNOWN for any other)."""
    return STAGES.get(str(name), UNKNOWN)
