"""Every generated block of README and docs/ is what its source renders now: the planner, the settings'
fields, or a bench's results under bench/results/. A figure changes by running the bench and then
`python scripts/docs_tables.py`, never by typing it."""

import json
import sys

import pytest
from conftest import ROOT

sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "scripts")]

import docs_tables  # noqa: E402
import real  # noqa: E402
import results_file  # noqa: E402


@pytest.mark.parametrize("name", list(docs_tables.TABLES))
def test_each_page_holds_the_table_its_source_renders(name):
    _, render = docs_tables.TABLES[name]
    assert docs_tables.block(name) == render(), f"{name}: run python scripts/docs_tables.py"


def test_a_changed_result_changes_the_rendered_table(tmp_path):
    """The renderer reads the results file: a measured figure moved there moves the page's table."""
    results = json.loads(real.CPU_RESULTS.read_text(encoding="utf-8"))
    case = results["memory"]["cases"][0]
    case["step"]["measured"] += 0.1
    moved = tmp_path / "results.json"
    moved.write_text(json.dumps(results), encoding="utf-8")
    assert real.cpu_table(moved) != docs_tables.block("real-memory-cpu")


# Tables each read from one rows file under bench/results/: block -> (results file, render it from a path);
# the bench modules as docs_tables imported them
ROWS_FILES = {
    "lean-logits-cpu": ("lean-logits-cpu", lambda at: docs_tables.lean_logits.table("cpu", at)),
    "cpu-allocator": ("cpu-allocator", docs_tables.cpu_allocator.table),
    "duration": ("duration", docs_tables.duration.table),
    "demo-duration": ("demo-duration", docs_tables.demo_duration.table),
    "lean-attention": ("lean-attention", docs_tables.lean_attention.table),
    "packed-vocab": ("packed-vocab", docs_tables.packed_vocab.table),
    "real-foodpo": ("real-foodpo", lambda at: docs_tables.real.section_table("foodpo", at)),
}


@pytest.mark.parametrize("name", list(ROWS_FILES))
def test_a_moved_figure_in_a_rows_file_moves_its_table(name, tmp_path):
    """The first number of the first row, moved in a copy of the results file, changes the rendered block."""
    results_name, render = ROWS_FILES[name]
    results = results_file.load(results_name)
    row = results["rows"][0]
    key = next(k for k, v in row.items() if isinstance(v, (int, float, dict)) and not isinstance(v, bool))
    row[key] = {**row[key], "median": row[key]["median"] + 1} if isinstance(row[key], dict) else row[key] + 1
    moved = tmp_path / f"{results_name}.json"
    moved.write_text(json.dumps(results), encoding="utf-8")
    assert render(moved) != docs_tables.block(name)
