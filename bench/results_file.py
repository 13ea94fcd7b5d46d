"""A bench's results as data. A bench writes what it measured to bench/results/NAME.json, with the
command and the machine. The docs render their tables from that file (scripts/docs_tables.py), so a
figure changes by running the bench again, never by typing it.

A row is a dict of plain values: a number, a string, None (not measured, shown as "-"), or the
spread of several rounds ({"median", "min", "max"}, shown as "median [min-max]")."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def spread(values: list[float]) -> dict[str, float]:
    """The rounds' median and range, as the results files keep them."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spreads(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Each figure of the RUNS (dicts with the same keys) as its spread."""
    return {key: spread([run[key] for run in runs]) for key in runs[0]}


def arm_rows(rounds: list[dict], figures: dict[str, str], arm: str, against: str) -> list[dict]:
    """One row per figure of FIGURES (key -> label) of rounds of arms: each arm's spread, and ARM's ratio to
    AGAINST's, taken round by round."""
    return [{"figure": label, **{name: spread([r[name][key] for r in rounds]) for name in rounds[0]},
             "ratio": spread([r[arm][key] / r[against][key] for r in rounds])}
            for key, label in figures.items()]  # fmt: skip


def provenance() -> dict[str, str]:
    """Which command measured the results, on which machine."""
    from mpskit.machine.hardware import detect

    script = Path(sys.argv[0]).name
    return {"command": " ".join(["python", f"bench/{script}", *sys.argv[1:]]),
            "machine": f"{detect().chip}, {os.cpu_count()} cores, {platform.system()}"}  # fmt: skip


def path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def save(rows: list[dict], target: Path, **more) -> None:
    """Write the rows, the command and the machine to TARGET (a file under bench/results/)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({**provenance(), **more, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {target}; python scripts/docs_tables.py renders the docs' tables from bench/results/")


def load(name: str, at: Path | None = None) -> dict:
    return json.loads((at or path(name)).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Column:
    """One column of a rendered table: its header, the row's key, and the format of its figures
    (".2f", "+.1%" for a signed share, ".1e")."""

    header: str
    key: str
    format: str = ".2f"

    def cell(self, value) -> str:
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        if isinstance(value, dict):
            median, low, high = (format(value[k], self.format) for k in ("median", "min", "max"))
            joint = ".." if self.format.startswith("+") else "-"
            return median if low == high else f"{median} [{low}{joint}{high}]"
        return format(value, self.format) if isinstance(value, float) else str(value)


def render(columns: list[Column], rows: list[dict]) -> str:
    """A Markdown table of the rows."""
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(c.cell(row.get(c.key)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def block(columns: list[Column], results: dict, *said: str, rows: list[dict] | None = None) -> str:
    """What a page shows of a results file: the table of its rows (or ROWS), the sentences SAID under it,
    and where the figures come from."""
    return "\n\n".join([render(columns, results["rows"] if rows is None else rows), *said, source_line(results)])


def source_line(results: dict) -> str:
    """Where the figures come from, as the docs say under each table."""
    said = f"`{results['command']}`, {results['machine']}"
    return f"Source: {said}; {results['source']}." if results.get("source") else f"Source: {said}."
