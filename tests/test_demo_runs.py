"""`mpskit demo` reads each stage's own run folder, the one its training child names, never
`output/demo-<stage>/latest`, which a second demo in the same folder moves (the stages' training itself
is the real tier's: tests/test_real.py)."""

import sys

from mpskit.rundir.record import FINISHED, Attempt, RunRecord, write_record
from mpskit.tools import demo


def test_a_stage_reads_the_run_its_child_named_not_latest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "output" / "demo-sft"
    for name in ("ours", "another-demos"):
        (runs / name).mkdir(parents=True)
        write_record(runs / name, RunRecord(run_name="demo-sft", stage="sft", device="cpu",
                                            attempts=[Attempt(1, outcome=FINISHED)]))  # fmt: skip
        (runs / name / "llamafactory.yaml").write_text("stage: sft\n")
    (runs / "latest").symlink_to("another-demos")  # the second demo's run started last
    child = f"print('mpskit: run directory {runs / 'ours'}')"  # what `mpskit train` says first
    monkeypatch.setattr(demo, "mpskit_command", lambda *words: [sys.executable, "-c", child])
    result = demo.run_stage("sft", None, tmp_path / "sft.log")
    assert result.run_dir == runs / "ours"
