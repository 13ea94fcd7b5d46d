"""The README's "what fits on which Mac" table, from the planner (no training, no torch).

For each hardware profile, stage and Qwen2.5 model: the largest cutoff_len (of 256, 512, ... 32768)
for which the planner finds a setting that fits without lowering it: as LLaMA-Factory runs (whole
logits, its own attention), with lean logits, and with lean logits and lean attention (`auto`: where
the attention would be materialised, i.e. on the Macs). The planner may move every other knob
(batch with accumulation, checkpointing, attention, dtype, LoRA rank down to 4).

    python bench/what_fits.py            print the table
    python bench/what_fits.py --write    replace the table in README.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpskit.errors import MpskitError  # noqa: E402
from mpskit.inputs.resolve import resolve  # noqa: E402
from mpskit.plan.advice import plan_run  # noqa: E402

PROFILES = ("m1-8gb", "m1-pro-16gb", "m2-max-32gb", "m3-max-64gb", "m4-max-128gb", "cpu", "cuda-24gb")
STAGES = {"sft": "sft", "dpo / foodpo": "dpo"}  # fooDPO's memory is DPO's
MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b")
CUTOFFS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# column label -> the lean switches (lean_attention None: auto)
PATHS = {"whole": (False, False), "lean logits": (True, False), "+ lean attention": (True, None)}
START, END = "<!-- what-fits:start -->", "<!-- what-fits:end -->"


def largest_cutoff(hardware: str, stage: str, model: str, lean_logits: bool, lean_attention: bool | None) -> int | None:
    largest = None
    for cutoff in CUTOFFS:
        words = {"stage": stage, "model_preset": model, "cutoff_len": cutoff, "min_cutoff_len": cutoff,
                 "lean_logits": lean_logits}  # fmt: skip
        if lean_attention is not None:
            words["lean_attention"] = lean_attention
        if not plan_run(resolve(words, hardware=hardware)).fits:
            break
        largest = cutoff
    return largest


def table() -> str:
    def cell(value: int | None) -> str:
        return "-" if value is None else str(value)

    header = "| hardware | stage | " + " | ".join(f"{m} {path}" for m in MODELS for path in PATHS) + " |"
    lines = [header, "|" + "---|" * (2 + len(PATHS) * len(MODELS))]
    for hardware in PROFILES:
        for label, stage in STAGES.items():
            cells = [cell(largest_cutoff(hardware, stage, model, *lean)) for model in MODELS for lean in PATHS.values()]
            lines.append(f"| {hardware} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_in(readme: Path, text: str) -> None:
    content = readme.read_text(encoding="utf-8")
    if START not in content or END not in content:
        raise MpskitError(f"{readme} has no {START} ... {END} block", "add the two markers where the table goes")
    before, rest = content.split(START, 1)
    _, after = rest.split(END, 1)
    readme.write_text(f"{before}{START}\n{text}\n{END}{after}", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace the table in README.md")
    ns = parser.parse_args()
    text = table()
    if ns.write:
        replace_in(ROOT / "README.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
