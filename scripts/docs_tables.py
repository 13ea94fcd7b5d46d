"""The docs' generated tables, written into their pages between their markers: the key table of
docs/usage.md (mpskit's own settings, from their fields: mpskit/settings/settings_help.py), the
what-fits table of docs/memory-and-planner.md (bench/what_fits.py, from the planner) and the GGUF
export's figures in docs/gguf.md and their line in README.md (bench/results/gguf.json, which
bench/gguf_export.py writes), and what `mpskit train` adds to a run in docs/measurements.md
(bench/results/overhead.json, bench/overhead.py's), the plan against the whole run's peak in
docs/quantized.md (bench/results/qlora-*.json, bench/qlora.py's), and the real model's plan against
its measured memory in docs/real-model.md and README.md (bench/results/real-memory-*.json,
bench/real.py's). tests/test_docs_tables.py holds each page to its table.

    python scripts/docs_tables.py      rewrite them all
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import gguf_export  # noqa: E402
import overhead  # noqa: E402
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
          "real-memory-line": (ROOT / "README.md", real.readme_table)}  # fmt: skip


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
