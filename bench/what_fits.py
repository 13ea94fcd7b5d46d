"""The "what fits on which Mac" table of docs/memory-and-planner.md, from the planner (no training, no torch).

For each hardware profile, stage and model: the largest cutoff_len (of 256, 512, ... 32768) for
which the planner finds a setting that fits without lowering it. For Qwen2.5-0.5B and 1.5B with
16-bit weights: as LLaMA-Factory runs (whole logits, its own attention), with lean logits, and with
lean logits and lean attention (`auto`: where the attention would be materialised, i.e. on the Macs).
For the 7B-14B models with both lean paths, in 16 bits where they fit and else in 4 bits (marked
`q4`; `q4e`: the embeddings and the output layer in 4 bits too, quantize_embeddings). The planner
may move every other knob (batch with accumulation, checkpointing, attention, dtype, LoRA rank down
to 4).

    python bench/what_fits.py            print the table
    python scripts/docs_tables.py        write it (and the key table) into the docs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpskit.plan.advice import plan_run  # noqa: E402
from mpskit.settings.resolve import resolve  # noqa: E402

PROFILES = ("m1-8gb", "m1-pro-16gb", "m2-max-32gb", "m3-max-64gb", "m4-max-128gb", "cpu", "cuda-24gb")
STAGES = {"sft": "sft", "dpo / foodpo": "dpo"}  # fooDPO's memory is DPO's
CUTOFFS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# column label -> the lean switches (lean_attention None: auto) and whether 4 bits are allowed
PATHS = {"whole": (False, False, False), "lean logits": (True, False, False), "+ lean attention": (True, None, False)}
COLUMNS = [(model, label, *path) for model in ("qwen2.5-0.5b", "qwen2.5-1.5b") for label, path in PATHS.items()]
COLUMNS += [(model, "lean, 16 or 4-bit", True, None, True) for model in ("qwen2.5-7b", "qwen3-8b", "qwen2.5-14b")]


def largest_fit(hardware: str, stage: str, model: str, lean_logits: bool, lean_attention: bool | None,
                four_bit: bool = False) -> tuple[int | None, str]:  # fmt: skip
    """The largest cutoff that fits (None: not even 256), and its plan's bits: "", "q4", or "q4e" (the
    embeddings and output layer too)."""
    largest = None, ""
    for cutoff in CUTOFFS:
        words = {"stage": stage, "model_preset": model, "cutoff_len": cutoff, "min_cutoff_len": cutoff,
                 "lean_logits": lean_logits}  # fmt: skip
        if lean_attention is not None:
            words["lean_attention"] = lean_attention
        if not four_bit:
            words["oom_ladder"] = "keep"  # the planner keeps 16-bit weights
        result = plan_run(resolve(words, hardware=hardware))
        if not result.fits:
            break
        knobs = result.chosen.knobs
        largest = cutoff, "" if knobs.quantization_bit is None else "q4e" if knobs.quantize_embeddings else "q4"
    return largest


def largest_cutoff(hardware: str, stage: str, model: str, lean_logits: bool, lean_attention: bool | None) -> int | None:
    """The largest cutoff that fits with 16-bit weights."""
    return largest_fit(hardware, stage, model, lean_logits, lean_attention)[0]


def table() -> str:
    header = "| hardware | stage | " + " | ".join(f"{model} {label}" for model, label, *_ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (2 + len(COLUMNS))]
    for hardware in PROFILES:
        for label, stage in STAGES.items():
            fits = [largest_fit(hardware, stage, model, *path) for model, _, *path in COLUMNS]
            cells = ["-" if cut is None else f"{cut} {bits}".strip() for cut, bits in fits]
            lines.append(f"| {hardware} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
