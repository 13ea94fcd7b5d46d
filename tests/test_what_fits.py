"""The README's "what fits" table is the planner's, not typed by hand."""

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import what_fits  # noqa: E402


def test_readme_table_is_the_planners():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split(what_fits.START, 1)[1].split(what_fits.END, 1)[0].strip()
    assert block == what_fits.table(), "run: python bench/what_fits.py --write"


def test_lean_logits_fit_dpo_at_2048_on_a_16_gb_mac():
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-0.5b", lean=True) >= 2048
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-0.5b", lean=False) < 2048
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-1.5b", lean=True) >= 1024
