"""The `mpskit plan` examples of README and docs/: the planner's own output, run in this process, not
typed by hand. scripts/docs_tables.py writes each between its markers, and a test holds the pages to
them, so a moved constant moves its examples.

Each example shows its command and the lines it keeps: some by their start (`lines`), one and those
after it (`following`, as `grep -A`), or all (`whole`). Where `lines` skips detail lines, `  ...` says so.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from mpskit.cli import main

ROOT = Path(__file__).resolve().parent.parent
Pick = Callable[[list[str]], list[str]]


def lines(*starts: str) -> Pick:
    """The lines that start with one of `starts`; a run of skipped indented lines becomes `  ...`."""

    def pick(output: list[str]) -> list[str]:
        kept, skipped_detail = [], False
        for line in output:
            if line.startswith(starts):
                if skipped_detail and line.startswith(" "):
                    kept.append("  ...")
                kept.append(line)
                skipped_detail = False
            else:
                skipped_detail = line.startswith(" ") and bool(kept)
        return kept

    return pick


def following(start: str, count: int) -> Pick:
    """The first line that starts with `start` and the `count` after it, as `grep -A` shows them."""

    def pick(output: list[str]) -> list[str]:
        first = next(i for i, line in enumerate(output) if line.startswith(start))
        return output[first : first + count + 1]

    return pick


def whole(output: list[str]) -> list[str]:
    return output


@dataclass(frozen=True)
class Example:
    """One `mpskit plan` command and the lines of its output a page shows."""

    words: tuple[str, ...]  # after `mpskit plan`
    pick: Pick
    shown: str = ""  # the shell's filter as the page shows it, where the pick stands for one

    def render(self) -> list[str]:
        """The plan as a machine with an empty hub cache prints it: the same on every machine."""
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as empty, mock.patch.dict("os.environ", HF_HUB_CACHE=empty):
            with contextlib.redirect_stdout(out):
                main(["plan", *self.words])
        command = " ".join(("$ mpskit plan", *self.words, *([self.shown] if self.shown else [])))
        return [command, *self.pick(out.getvalue().rstrip("\n").split("\n"))]


M1_PRO = ("--hardware", "m1-pro-16gb")
EXAMPLES: dict[str, tuple[Path, tuple[Example, ...]]] = {
    "plan-7b-foodpo": (ROOT / "README.md", (Example(
        ("stage=foodpo", "model_preset=qwen2.5-7b", "cutoff_len=2048", *M1_PRO),
        lines("run", "budget", "verdict", "chosen", "estimate", "  weights", "  = ", "evaluation", "logits",
              "attention", "changed    evaluation", "changed    4-bit", "duration", "  time 4")),)),
    "plan-0.5b-foodpo": (ROOT / "docs" / "memory-and-planner.md", (Example(
        ("stage=foodpo", "model_preset=qwen1.5-0.5b", *M1_PRO), whole),)),
    "plan-4-bit-duration": (ROOT / "docs" / "memory-and-planner.md", (Example(
        ("stage=foodpo", "model_preset=qwen2.5-7b", "cutoff_len=2048", "min_cutoff_len=2048", *M1_PRO),
        following("duration", 1), "| grep -A1 duration"),)),
    "plan-unmeasured-duration": (ROOT / "docs" / "memory-and-planner.md", (Example(
        ("stage=sft", "model_preset=qwen2.5-0.5b", *M1_PRO), following("duration", 4), "| grep -A4 duration"),)),
    "plan-4-bit": (ROOT / "docs" / "quantized.md", (Example(
        ("stage=foodpo", "model_preset=qwen2.5-7b", "cutoff_len=2048", "min_cutoff_len=2048", *M1_PRO),
        lines("verdict", "chosen")),)),
    "plan-4-bit-tables": (ROOT / "docs" / "quantized.md", (Example(
        ("stage=sft", "model_preset=qwen2.5-14b", "cutoff_len=1024", "min_cutoff_len=1024", *M1_PRO),
        lines("verdict", "chosen", "changed    the embeddings")),)),
    "plan-lean-attention": (ROOT / "docs" / "lean-paths.md", tuple(Example(
        ("stage=foodpo", "model_preset=qwen2.5-1.5b", "cutoff_len=4096", *lean, *M1_PRO),
        lines("verdict", "chosen", "attention")) for lean in ((), ("lean_attention=false",)))),
}  # fmt: skip


def render(name: str) -> str:
    _, examples = EXAMPLES[name]
    return "\n".join(["```", *(line for example in examples for line in example.render()), "```"])
