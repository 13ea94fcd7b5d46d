"""Every generated block of README and docs/ is what its source renders now: the planner, the settings'
fields, or a bench's results under bench/results/. A figure changes by running the bench and then
`python scripts/docs_tables.py`, never by typing it."""

import sys

import pytest
from conftest import ROOT

sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "scripts")]

import docs_tables  # noqa: E402


@pytest.mark.parametrize("name", list(docs_tables.TABLES))
def test_each_page_holds_the_table_its_source_renders(name):
    _, render = docs_tables.TABLES[name]
    assert docs_tables.block(name) == render(), f"{name}: run python scripts/docs_tables.py"


def test_a_changed_result_changes_the_rendered_table(tmp_path):
    """The renderer reads the results file: a measured figure moved there moves the page's table."""
    import json

    import real

    results = json.loads(real.CPU_RESULTS.read_text(encoding="utf-8"))
    case = results["memory"]["cases"][0]
    case["step"]["measured"] += 0.1
    moved = tmp_path / "results.json"
    moved.write_text(json.dumps(results), encoding="utf-8")
    assert real.cpu_table(moved) != docs_tables.block("real-memory-cpu")
