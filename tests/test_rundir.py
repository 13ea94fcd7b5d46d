"""The run folder: the typed record round-trips, and resume never picks a checkpoint whose save did not finish."""

import errno
import json
import multiprocessing
import os
import re
import time
from pathlib import Path

import pytest

from mpskit.errors import MpskitError
from mpskit.rundir.checkpoints import last_checkpoint
from mpskit.rundir.folder import RunDir, claim_run_dir, point_latest, release
from mpskit.rundir.record import Attempt, RunRecord, read_record, write_record


def make_checkpoint(run_dir, step: int, state: str | None = '{"global_step": 1}', weights: bool = True,
                    cut_weights: bool = False, optimizer: bool = True, scheduler: bool = True):  # fmt: skip
    """A checkpoint folder as transformers writes it, with real (tiny) safetensors and torch.save files."""
    import torch
    from safetensors.torch import save_file

    path = run_dir / f"checkpoint-{step}"
    path.mkdir()
    if state is not None:
        (path / "trainer_state.json").write_text(state)
    if weights:
        save_file({"lora_A": torch.ones(64, 8)}, path / "adapter_model.safetensors")
        if cut_weights:  # a full disk mid-write
            data = (path / "adapter_model.safetensors").read_bytes()
            (path / "adapter_model.safetensors").write_bytes(data[: len(data) - 100])
    if optimizer:
        torch.save({"state": {0: torch.ones(8)}}, path / "optimizer.pt")
    if scheduler:
        torch.save({"last_epoch": step}, path / "scheduler.pt")
    return path


def test_newest_complete_checkpoint_wins_and_incomplete_ones_are_kept_aside(tmp_path, capsys):
    good = make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 8, state='{"global_st')  # killed while writing trainer_state.json
    make_checkpoint(tmp_path, 12, state=None)  # killed before it
    make_checkpoint(tmp_path, 10, weights=False)
    assert last_checkpoint(tmp_path) == good
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["checkpoint-10.incomplete", "checkpoint-12.incomplete", "checkpoint-4", "checkpoint-8.incomplete"]
    err = capsys.readouterr().err
    assert "skipped checkpoint-12: no readable trainer_state.json" in err and "checkpoint-10: no weights" in err
    make_checkpoint(tmp_path, 12, state=None)  # the same step killed again after a resume
    assert last_checkpoint(tmp_path) == good and (tmp_path / "checkpoint-12.incomplete-2").is_dir()


def test_cut_short_weights_or_a_missing_optimizer_are_incomplete(tmp_path, capsys):
    import zipfile

    good = make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 4, cut_weights=True)
    make_checkpoint(tmp_path, 6, optimizer=False)
    make_checkpoint(tmp_path, 8, scheduler=False)
    with zipfile.ZipFile(make_checkpoint(tmp_path, 10, optimizer=False) / "optimizer.pt", "w") as archive:
        archive.writestr("notes.txt", "a zip, but not what torch.save writes")
    assert last_checkpoint(tmp_path) == good
    err = capsys.readouterr().err
    assert "checkpoint-4: adapter_model.safetensors is cut short" in err
    assert "checkpoint-6: no readable optimizer.pt" in err and "checkpoint-10: no readable optimizer.pt" in err
    assert "checkpoint-8: no readable scheduler.pt" in err


def test_no_checkpoint_at_all(tmp_path):
    assert last_checkpoint(tmp_path) is None


def test_record_round_trips_and_updates(tmp_path):
    record = RunRecord(run_name="r", stage="dpo", device="cpu", mpskit_args={"lean_logits": True})
    write_record(tmp_path, record)
    RunDir(tmp_path, read_record(tmp_path)).add_attempt(Attempt(1, outcome="finished"))
    again = read_record(tmp_path)
    assert again.attempts == [Attempt(1, outcome="finished")] and again.mpskit_args == {"lean_logits": True}
    data = json.loads((tmp_path / "mpskit.json").read_text())
    assert list(data)[:3] == ["run_name", "stage", "device"]
    data["written_by_a_newer_mpskit"] = {"kept": True}
    (tmp_path / "mpskit.json").write_text(json.dumps(data))
    assert read_record(tmp_path).stage == "dpo"
    RunDir(tmp_path, read_record(tmp_path)).add_attempt(Attempt(2, outcome="finished"))  # rewritten
    data = json.loads((tmp_path / "mpskit.json").read_text())
    assert data["written_by_a_newer_mpskit"] == {"kept": True} and len(data["attempts"]) == 2


def test_a_record_write_on_a_full_disk_leaves_the_record_it_had(tmp_path, monkeypatch):
    """The write goes to a temporary file first: ENOSPC there leaves mpskit.json whole and readable."""
    write_record(tmp_path, RunRecord(run_name="r", stage="sft", device="cpu", attempts=[Attempt(1, outcome="stopped")]))
    before = (tmp_path / "mpskit.json").read_bytes()

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        RunDir(tmp_path, read_record(tmp_path)).add_attempt(Attempt(2, outcome="finished", next_rung="x" * 100_000))
    assert (tmp_path / "mpskit.json").read_bytes() == before
    assert read_record(tmp_path).attempts == [Attempt(1, outcome="stopped")]
    assert [p.name for p in tmp_path.iterdir()] == ["mpskit.json"]  # no temporary file left behind


def test_config_force_over_a_link_is_refused_and_changes_neither(tmp_path, tiny_model):
    from conftest import ROOT, run_mpskit

    own = tmp_path / "run.yaml"
    own.write_text("stage: sft\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(own)
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen"]
    result = run_mpskit("config", *words, "-o", str(link), "--force", cwd=tmp_path)
    assert result.returncode == 2 and "link.yaml is not a regular file" in result.stderr, result.stderr[-2000:]
    assert own.read_text() == "stage: sft\n" and link.is_symlink()


def test_latest_only_under_output_never_beside_a_users_own_output_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_run = tmp_path / "model" / "run"  # output_dir=<model>/run
    model_run.mkdir(parents=True)
    (tmp_path / "model" / "latest").symlink_to("weights")  # the user's own relative link
    point_latest(model_run)
    assert os.readlink(tmp_path / "model" / "latest") == "weights"
    elsewhere = tmp_path / "mine" / "run"
    elsewhere.mkdir(parents=True)
    point_latest(elsewhere)
    assert not (tmp_path / "mine" / "latest").exists()
    ours = tmp_path / "output" / "sft-model" / "20260101-000000"
    ours.mkdir(parents=True)
    point_latest(Path("output") / "sft-model" / "20260101-000000")
    assert (ours.parent / "latest").resolve() == ours


def test_resume_of_a_finished_run_changes_nothing(tmp_path):
    from conftest import run_mpskit

    run_dir = tmp_path / "output" / "f" / "20260101-000000"
    run_dir.mkdir(parents=True)
    write_record(run_dir, RunRecord(run_name="f", stage="sft", device="cpu", attempts=[Attempt(1, outcome="finished")]))
    (run_dir / "llamafactory.yaml").write_text("stage: sft\n")
    make_checkpoint(run_dir, 2)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    result = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0 and "already finished (attempt 1); nothing to resume" in result.stderr
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before


def test_links_planted_in_a_run_folder_are_not_written_through(tmp_path):
    from conftest import run_mpskit

    run_dir = tmp_path / "output" / "f" / "20260101-000000"
    run_dir.mkdir(parents=True)
    write_record(run_dir, RunRecord(run_name="f", stage="sft", device="cpu", attempts=[Attempt(1, outcome="finished")]))
    (run_dir / "llamafactory.yaml").write_text("stage: sft\n")
    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "elsewhere"
    victim.write_text("mine\n")
    elsewhere.mkdir()
    (run_dir / ".mpskit.lock").symlink_to(victim)
    (run_dir / "eval").symlink_to(elsewhere)
    result = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)  # a no-op that takes the lock
    assert result.returncode == 2 and ".mpskit.lock is a link, not mpskit's lock file" in result.stderr
    assert victim.read_text() == "mine\n" and (run_dir / ".mpskit.lock").is_symlink()
    run = RunDir.open(run_dir)
    with pytest.raises(MpskitError, match="eval is a link"):
        run.new_folder("eval", "pairs-20260101-000000")
    assert list(elsewhere.iterdir()) == []
    (run_dir / "eval").unlink()
    assert run.new_folder("eval", "x") == run_dir / "eval" / "x" and run.new_folder("eval", "x").name == "x-2"


def test_only_the_run_folder_module_reads_or_writes_the_files_of_a_run():
    """mpskit.json, llamafactory.yaml, all_results.json and trainer_log.jsonl are named (outside
    docstrings) and their names imported nowhere but in mpskit/rundir/: every other module asks a RunDir."""
    import ast

    from conftest import ROOT

    files = ("mpskit.json", "llamafactory.yaml", "all_results.json", "trainer_log.jsonl")
    found = []
    for path in sorted((ROOT / "mpskit").rglob("*.py")):
        if path.parent.name == "rundir":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and ast.get_docstring(node) is not None
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found += [f"{path.name}:{node.lineno} {name}" for name in files if name in node.value]
            if isinstance(node, ast.ImportFrom) and node.module.startswith("mpskit.rundir"):
                names = [alias.name for alias in node.names]
                found += [f"{path.name}:{node.lineno} {name}" for name in names if name in ("RECORD", "YAML", "LOG")]
    assert found == []


def test_run_attempts_reads_the_record_once(tmp_path, monkeypatch):
    """The record is read when the folder is opened, and under the lock; never again by the attempts."""
    from mpskit.rundir import folder

    run = RunDir.create(tmp_path / "run", RunRecord(run_name="r", stage="sft", device="cpu"), "stage: sft\n")
    reads = []
    monkeypatch.setattr(folder, "read_record", lambda path: reads.append(path) or RunRecord("r", "sft", "cpu"))
    with run.locked("test"):
        assert reads == [run.path]
    source = Path(__file__).parents[1].joinpath("mpskit", "run", "attempts.py").read_text(encoding="utf-8")
    assert "read_record" not in source and "RunDir.open" not in source


def test_resume_from_a_checkpoint_of_another_lora_rank_is_refused_before_anything_starts(tmp_path):
    from mpskit.errors import MpskitError
    from mpskit.recipes.checks import check_resume_from

    checkpoint = make_checkpoint(tmp_path, 4)
    (checkpoint / "adapter_config.json").write_text(json.dumps({"r": 16, "peft_type": "LORA"}))
    check_resume_from(str(checkpoint), {"lora_rank": 16})
    with pytest.raises(MpskitError, match="rank 16; this run's lora_rank is 8"):
        check_resume_from(str(checkpoint), {})


def _claim_at(barrier: str, root: str, output_dir: str | None, results) -> None:
    """In a child: wait for the barrier file, then claim a run folder; its path or the error."""
    while not os.path.exists(barrier):
        time.sleep(0.0005)
    try:
        results.put(str(claim_run_dir("race", output_dir, root)))
    except MpskitError as err:
        results.put(f"refused: {err}")


@pytest.mark.parametrize("explicit", [False, True])
def test_two_runs_released_together_never_share_a_folder(tmp_path, explicit):
    context = multiprocessing.get_context("fork")
    for attempt in range(20):
        root, barrier = tmp_path / f"output-{attempt}", tmp_path / f"go-{attempt}"
        output_dir = str(tmp_path / f"mine-{attempt}") if explicit else None
        results = context.Queue()
        children = [context.Process(target=_claim_at, args=(str(barrier), str(root), output_dir, results))
                    for _ in range(2)]  # fmt: skip
        for child in children:
            child.start()
        barrier.touch()
        for child in children:
            child.join(30)
        got = sorted(results.get(timeout=5) for _ in children)
        claimed = [path for path in got if not path.startswith("refused")]
        assert len(set(claimed)) == len(claimed), got  # never one folder for both
        assert len(claimed) == (1 if explicit else 2), got
        if explicit:
            assert "was taken by another run" in got[1] or "already holds files" in got[1], got


def test_a_run_folder_is_never_made_inside_a_model_or_another_run(tmp_path):
    model = tmp_path / "output" / "tiny-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    with pytest.raises(MpskitError, match="would be inside the model folder"):
        claim_run_dir("tiny-model", None, tmp_path / "output")
    run = claim_run_dir("sft", None, tmp_path / "output")
    (run / "llamafactory.yaml").write_text("stage: sft\n")
    (run / "mpskit.json").write_text("{}")
    with pytest.raises(MpskitError, match="would be inside the run"):
        claim_run_dir("x", str(run / "inner"), tmp_path / "output")
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]
    unused = claim_run_dir("sft", None, tmp_path / "output")
    release(unused)
    assert not unused.exists()


def test_rebuild_record_is_only_for_a_damaged_record_of_a_folder_named_and_made_by_mpskit(tmp_path):
    from conftest import run_mpskit

    def rebuild(*where: str):
        result = run_mpskit("train", "--resume", *where, "--rebuild-record", cwd=tmp_path)
        assert "Traceback" not in result.stderr
        return result

    def folder(name: str, record: str | None, yaml_text: str) -> Path:
        path = tmp_path / "output" / name / "20260101-000000"
        path.mkdir(parents=True)
        if record is not None:
            (path / "mpskit.json").write_text(record)
        (path / "llamafactory.yaml").write_text(yaml_text)
        return path

    def snapshot(path: Path) -> dict:
        return {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}

    healthy = folder("healthy", None, "stage: sft\n")
    write_record(healthy, RunRecord(run_name="healthy", stage="sft", device="cpu",
                                    attempts=[Attempt(1, outcome="stopped by SIGINT")]))  # fmt: skip
    users = folder("users", None, "stage: sft\noutput_dir: somewhere/else\n")
    (users / "README.md").write_text("my notes\n")
    bomb = folder("bomb", "{cut", "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(12)))  # fmt: skip
    before = {path: snapshot(path) for path in (healthy, users, bomb)}
    cases = [((), "needs the run folder named"), ((str(healthy),), "is readable: --rebuild-record is for a damaged"),
             ((str(users),), "not a run folder mpskit made"), ((str(bomb),), "expands past")]  # fmt: skip
    for where, needle in cases:
        result = rebuild(*where)
        assert result.returncode == 2 and needle in result.stderr, result.stderr
    assert {path: snapshot(path) for path in (healthy, users, bomb)} == before

    finished = folder("finished", "", "stage: sft\n")
    damaged = {"run_name": "finished", "attempts": "not a list", "mpskit_args": {"lean_logits": False}}
    (finished / "mpskit.json").write_text(json.dumps(damaged))
    (finished / "all_results.json").write_text('{"train_runtime": 10.0, "train_loss": 2.5}')
    result = rebuild(str(finished))
    assert result.returncode == 0 and "already finished" in result.stderr, result.stderr
    rebuilt = read_record(finished)
    assert rebuilt.mpskit_args == {"lean_logits": False} and [a.outcome for a in rebuilt.attempts] == ["finished"]
    assert json.loads((finished / "all_results.json").read_text())["train_runtime"] == 10.0


def test_folders_named_by_the_time_are_made_by_one_process_each(tmp_path):
    from mpskit.files import make_new_folder

    made = [make_new_folder(tmp_path / "demo-logs" / "20260101-000000") for _ in range(3)]
    assert [path.name for path in made] == ["20260101-000000", "20260101-000000-2", "20260101-000000-3"]


def test_a_trainer_log_cut_mid_line_reads_without_its_last_line_and_a_bad_line_is_one_line(tmp_path):
    from mpskit.rundir.trainer_log import read_log

    log = tmp_path / "trainer_log.jsonl"
    log.write_text('{"current_steps": 1, "loss": 2.0}\n{"current_steps": 2, "loss": 1.9}\n{"current_st')
    assert [entry["current_steps"] for entry in read_log(tmp_path)] == [1, 2]  # killed while appending step 3
    log.write_text('{"current_steps": 1, "loss": 2.0}\n[1, 2]\n{"current_steps": 3, "loss": 1.8}\n')
    with pytest.raises(MpskitError, match="line 2 is not a log entry"):
        read_log(tmp_path)
    log.write_text('{"current_steps": 1, "elapsed_time": "0:00:01"}\n{"current_steps": 2, "loss": "1.9"}\n')
    with pytest.raises(MpskitError, match='line 2: loss is "1.9", not a number'):
        read_log(tmp_path)
    log.write_text('{"current_steps": 1, "rewards/margins": [0.1]}\n{"current_steps": 2}\n')
    with pytest.raises(MpskitError, match=re.escape("line 1: rewards/margins is [0.1], not a number")):
        read_log(tmp_path)


RECORD_HEAD = '"run_name": "r", "stage": "sft", "device": "cpu"'
DAMAGED_RECORDS = [
    ("[" * 100_000, "not a readable run record (RecursionError)"),
    ("[1, 2]", "not a readable run record (TypeError)"),
    ('{"run_name": "r", "stage": 7, "device": "cpu"}', "damaged: stage is 7, not text"),
    ('{"run_name": "r", "device": "cpu"}', "damaged: stage is missing"),
    (f'{{{RECORD_HEAD}, "memory": "lots"}}', 'damaged: memory is "lots", not a mapping'),
    (f'{{{RECORD_HEAD}, "attempts": [1]}}', "damaged: attempts is [1], not a list of mappings"),
    (f'{{{RECORD_HEAD}, "attempts": [{{"attempt": 1, "outcome": 5}}]}}', "damaged: attempts[1].outcome is 5, not text"),
    (f'{{{RECORD_HEAD}, "attempts": [{{"attempt": "1"}}]}}', 'attempts[1].attempt is "1", not a whole number'),
    (f'{{{RECORD_HEAD}, "duration": {{"measured_s": "10 s"}}}}', 'duration.measured_s is "10 s", not a number'),
    (f'{{{RECORD_HEAD}, "memory": {{"measured": {{"training_gb": "1.2"}}}}}}',
     'memory.measured.training_gb is "1.2", not a number'),
    (f'{{{RECORD_HEAD}, "attempts": [{{"attempt": 1, "measured": {{"step_seconds": [0.1, "x"]}}}}]}}',
     'attempts[1].measured.step_seconds is [0.1, "x"], not a list of numbers'),
    (f'{{{RECORD_HEAD}, "ladder": {{"free": "lora_rank", "cutoff_floor": 256}}}}',
     'ladder.free is "lora_rank", not a list of texts'),
    (f'{{{RECORD_HEAD}, "keep_awake": 1}}', "keep_awake is 1, not true or false"),
    (f'{{{RECORD_HEAD}, "environment": {{"PYTORCH_ENABLE_MPS_FALLBACK": [1]}}}}',
     'environment is {"PYTORCH_ENABLE_MPS_FALLBACK": [1]}, not a mapping to texts'),
    (f'{{{RECORD_HEAD}, "data_rows": {{"mine": "many"}}}}', 'data_rows is {"mine": "many"}, not a mapping to whole'),
    (f'{{{RECORD_HEAD}, "memory": {{"measured": {{"samples_gb": [[1, "x"]]}}}}}}',
     'memory.measured.samples_gb is [[1, "x"]], not a list of lists of numbers'),
]


@pytest.mark.parametrize("text, said", DAMAGED_RECORDS)
def test_a_record_too_deep_or_of_wrong_types_is_damaged_in_one_line_naming_the_field(tmp_path, text, said):
    (tmp_path / "mpskit.json").write_text(text)
    with pytest.raises(MpskitError, match=re.escape(said) + ".*--rebuild-record") as caught:
        read_record(tmp_path)
    assert "\n" not in str(caught.value)


def test_a_record_that_names_an_undecodable_file_name_reads(tmp_path):
    """A file name's byte that is no UTF-8 lives on in Python as a lone surrogate, which json writes
    and reads back; the record's check reads it too (pydantic's JSON reader alone would not)."""
    name = os.fsdecode(b"data-\xff.jsonl")
    write_record(tmp_path, RunRecord(run_name="r", stage="sft", device="cpu", layers=[name, "\\ud800"]))
    assert read_record(tmp_path).layers == [name, "\\ud800"]


def test_a_record_with_keys_of_a_newer_mpskit_reads_and_keeps_them(tmp_path):
    (tmp_path / "mpskit.json").write_text(f'{{{RECORD_HEAD}, "ladder": null, "added_later": {{"x": 1}}}}')
    record = read_record(tmp_path)
    assert record.ladder is None and record.other_keys == {"added_later": {"x": 1}}


def test_unknown_keys_inside_the_records_sections_survive_a_rewrite(tmp_path):
    newer = {"memory": {"budget_gb": 4.0, "newer_figure": 1}, "duration": {"steps": 3, "newer": "a"},
             "ladder": {"free": ["batch"], "cutoff_floor": 256, "newer": [1]},
             "attempts": [{"attempt": 1, "outcome": "finished", "newer": {"y": 2}}]}  # fmt: skip
    (tmp_path / "mpskit.json").write_text(f"{{{RECORD_HEAD}, " + json.dumps(newer)[1:])
    record = read_record(tmp_path)
    assert record.memory.budget_gb == 4.0 and record.attempts[0].outcome == "finished"
    write_record(tmp_path, record)
    written = json.loads((tmp_path / "mpskit.json").read_text())
    assert written["attempts"][0]["newer"] == {"y": 2} and written["ladder"]["newer"] == [1]
    assert written["memory"]["newer_figure"] == 1 and written["duration"]["newer"] == "a"
    assert "other_keys" not in json.dumps(written)


def test_the_summary_of_a_stop_mid_accumulation_gives_the_step_its_checkpoint_reached(tmp_path):
    """A second Ctrl-C while the step accumulated: nothing logged since, but checkpoint-3 was saved."""
    from mpskit.run.summary import summary_lines

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stopped = Attempt(1, outcome="stopped by SIGINT a second time, while stopping")
    record = RunRecord(run_name="r", stage="sft", device="cpu", attempts=[stopped])
    record.duration.steps = 8
    write_record(run_dir, record)
    (run_dir / "llamafactory.yaml").write_text("stage: sft\n")
    make_checkpoint(run_dir, 3)
    lines = summary_lines(RunDir.open(run_dir))
    assert ": step 3/8" in lines[0] and lines[-1] == f"mpskit: newest complete checkpoint: {run_dir}/checkpoint-3"


def test_a_rebuilt_record_of_a_run_stopped_early_is_not_finished(tmp_path):
    """LLaMA-Factory writes all_results.json at a stop too: the steps reached against the steps planned
    decide, so the rebuilt run resumes instead of passing its half-trained adapter for finished."""
    from mpskit.recipes.train import rebuild_record

    run_dir = tmp_path / "output" / "stopped" / "20260101-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "mpskit.json").write_text("{cut")
    (run_dir / "llamafactory.yaml").write_text("stage: sft\n")
    (run_dir / "all_results.json").write_text('{"train_runtime": 10.0, "train_loss": 2.5}')
    (run_dir / "trainer_state.json").write_text('{"global_step": 3, "max_steps": 8}')
    make_checkpoint(run_dir, 3)
    assert [a.outcome for a in rebuild_record(run_dir).record.attempts] == ["unknown (record rebuilt)"]
    (run_dir / "trainer_state.json").write_text('{"global_step": 8, "max_steps": 8}')
    (run_dir / "mpskit.json").write_text("{cut")
    assert [a.outcome for a in rebuild_record(run_dir).record.attempts] == ["finished"]
