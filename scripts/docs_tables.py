"""The docs' generated tables, written into their pages between their markers. Each comes from a
source that is not typed by hand:

- the key table of docs/usage.md: mpskit's own settings, from their fields (settings_help.py);
- the what-fits table of docs/memory-and-planner.md: the planner (bench/what_fits.py);
- the `mpskit plan` examples: the planner's output (plan_examples.py);
- every measured table: a bench's results under bench/results/, which the bench writes and its own
  module renders (results_file.py holds the rows' format).

tests/test_docs_tables.py holds each page to its table.

    python scripts/docs_tables.py      rewrite them all
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import answer_speed  # noqa: E402
import cpu_allocator  # noqa: E402
import demo_duration  # noqa: E402
import demo_time  # noqa: E402
import duration  # noqa: E402
import foodpo_overhead  # noqa: E402
import gguf_export  # noqa: E402
import lean_attention  # noqa: E402
import lean_logits  # noqa: E402
import memory_accuracy  # noqa: E402
import overhead  # noqa: E402
import packed_vocab  # noqa: E402
import plan_examples  # noqa: E402
import planner  # noqa: E402
import qlora  # noqa: E402
import real  # noqa: E402
import what_fits  # noqa: E402

from mpskit.errors import MpskitError  # noqa: E402
from mpskit.settings.settings_help import key_table  # noqa: E402

TABLES = {"key-table": (ROOT / "docs" / "usage.md", key_table),
          "what-fits": (ROOT / "docs" / "memory-and-planner.md", what_fits.table),
          "gguf": (ROOT / "docs" / "gguf.md", gguf_export.table),
          "gguf-line": (ROOT / "README.md", gguf_export.summary),
          "overhead": (ROOT / "docs" / "measurements.md", overhead.summary),
          "qlora-whole-run": (ROOT / "docs" / "quantized.md", qlora.whole_run_table),
          "real-memory-cpu": (ROOT / "docs" / "real-model.md", real.cpu_table),
          "real-memory-h200": (ROOT / "docs" / "real-model.md", real.h200_table),
          "real-memory-line": (ROOT / "README.md", real.readme_table),
          "lean-logits-cpu": (ROOT / "docs" / "measurements.md", lambda: lean_logits.table("cpu")),
          "lean-logits-cuda": (ROOT / "docs" / "measurements.md", lambda: lean_logits.table("cuda")),
          "cpu-allocator": (ROOT / "docs" / "measurements.md", cpu_allocator.table),
          "duration": (ROOT / "docs" / "measurements.md", duration.table),
          "demo-duration": (ROOT / "docs" / "measurements.md", demo_duration.table),
          "lean-attention": (ROOT / "docs" / "lean-paths.md", lean_attention.table),
          "lean-attention-kernel": (ROOT / "docs" / "lean-paths.md", lean_attention.kernel_table),
          "packed-vocab": (ROOT / "docs" / "quantized.md", packed_vocab.table),
          "qlora-arms": (ROOT / "docs" / "quantized.md", qlora.arms_table),
          "qlora-plan": (ROOT / "docs" / "quantized.md", qlora.plan_table),
          "foodpo-overhead": (ROOT / "docs" / "measurements.md", foodpo_overhead.table),
          "answer-speed": (ROOT / "docs" / "measurements.md", answer_speed.table),
          "planner": (ROOT / "docs" / "measurements.md", planner.table),
          "demo-time": (ROOT / "README.md", demo_time.summary),
          "memory-accuracy": (ROOT / "docs" / "measurements.md", memory_accuracy.table),
          "memory-accuracy-quantized": (ROOT / "docs" / "quantized.md",
                                        lambda: memory_accuracy.table(("quantized",))),
          **{f"real-{name}": (ROOT / "docs" / "real-model.md", lambda name=name: real.section_table(name))
             for name in real.SECTION_COLUMNS},
          **{name: (page, lambda name=name: plan_examples.render(name))
             for name, (page, _) in plan_examples.EXAMPLES.items()}}  # fmt: skip


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def block(name: str) -> str:
    """The table as its page holds it now."""
    page, _ = TABLES[name]
    start, end = markers(name)
    content = page.read_text(encoding="utf-8")
    if start not in content or end not in content:
        raise MpskitError(f"{page} has no {start} ... {end} block", "add the two markers where the table goes")
    return content.split(start, 1)[1].split(end, 1)[0].strip()


def write(name: str) -> None:
    page, make = TABLES[name]
    start, end = markers(name)
    block(name)  # the markers are there
    before, rest = page.read_text(encoding="utf-8").split(start, 1)
    after = rest.split(end, 1)[1]
    page.write_text(f"{before}{start}\n{make()}\n{end}{after}", encoding="utf-8")


if __name__ == "__main__":
    for table_name in TABLES:
        write(table_name)
        print(f"wrote the {table_name} table in {TABLES[table_name][0].relative_to(ROOT)}")
