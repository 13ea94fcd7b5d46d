"""Using what a run made: `mpskit chat` answers from the adapter, `mpskit export` writes a model that
plain transformers loads and that computes what the adapter-wrapped model computes."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, progress_line, run_mpskit

pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def training(tmp_path_factory, tiny_model) -> tuple[Path, str]:
    """A finished 3-step SFT run on the tiny model: its folder and what it printed."""
    work = tmp_path_factory.mktemp("use_run")
    result = run_mpskit(
        "train", "preset=sft", "model_preset=tiny", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}",
        "max_steps=3", "logging_steps=1", "eval_strategy=no", "learning_rate=0.05", "--hardware", "cpu", cwd=work,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return next((work / "output").glob("*/latest")).resolve(), result.stderr


@pytest.fixture(scope="module")
def finished_run(training) -> Path:
    return training[0]


@pytest.mark.e2e
def test_each_logged_step_prints_a_progress_line_and_logs_its_figures(training):
    run_dir, stderr = training
    line = progress_line(3)
    steps = [int(match[1]) for text in stderr.splitlines() if (match := line.match(text))]
    assert steps == [1, 2, 3], stderr[-3000:]
    entries = [json.loads(text) for text in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    training_entries = [entry for entry in entries if "loss" in entry]
    assert [entry["current_steps"] for entry in training_entries] == [1, 2, 3]
    assert all(entry["tokens_per_s"] > 0 and entry["memory_training_gb"] > 0 for entry in training_entries)
    assert all(entry["memory_predicted_gb"] > 0 for entry in training_entries)
    etas = [entry["eta_s"] for entry in training_entries]  # steps of a few milliseconds may round to 0
    assert etas[-1] == 0 and etas == sorted(etas, reverse=True)


@pytest.mark.e2e
def test_chat_answers_one_prompt_with_the_adapter(finished_run):
    result = run_mpskit("chat", str(finished_run), "--prompt", "Say hello.", "--max-new-tokens", "8", "-v")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"Loaded adapter(s): {finished_run}" in result.stderr  # LLaMA-Factory's own engine, with the run's LoRA
    assert result.stdout.endswith("\n")  # the answer (random tiny weights: any tokens), printed once


@pytest.mark.e2e
def test_ls_lists_the_runs_with_how_each_ended(finished_run, tmp_path, tiny_model):
    work = finished_run.parent.parent.parent
    damaged = work / "output" / "broken" / "20200101-000000"  # a record damaged from outside
    damaged.mkdir(parents=True)
    (damaged / "mpskit.json").write_text('{"run_name": "broken", "stage": 7, "device": "cpu"}')
    (damaged / "llamafactory.yaml").write_text("stage: sft\n")
    try:
        listed = run_mpskit("ls", cwd=work)
    finally:
        shutil.rmtree(damaged.parent)
    assert listed.returncode == 0, listed.stderr
    runs = listed.stdout.split("\nruns in ", 1)[1].splitlines()[1:]
    said = f"{damaged.relative_to(work)} {damaged}/mpskit.json is damaged: stage is 7, not text"
    assert runs[0].split() == said.split()
    mine = next(line for line in runs if str(finished_run.relative_to(work)) in line)
    assert mine.split()[1:4] == ["sft", tiny_model.name, "finished"] and "step 3/3, loss " in mine
    assert "none yet" in run_mpskit("ls", cwd=tmp_path).stdout


@pytest.mark.e2e
def test_chat_defaults_to_the_newest_run(finished_run):
    work = finished_run.parent.parent.parent
    result = run_mpskit("chat", "--prompt", "Hi", "--max-new-tokens", "4", "-v", cwd=work)
    assert result.returncode == 0 and f"Loaded adapter(s): {finished_run}" in result.stderr, result.stderr[-2000:]
    assert f"mpskit: the newest run: {finished_run.relative_to(work)}\n" in result.stderr  # it says which


@pytest.mark.e2e
def test_export_writes_a_model_that_computes_what_the_adapter_does(finished_run, tiny_model, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    result = run_mpskit("export", str(finished_run), "-o", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    wrapped = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), finished_run).eval()
    tokens = torch.tensor([[1, 17, 230, 5, 99, 401, 12, 7]])
    with torch.no_grad():
        expected, got = wrapped(tokens).logits, merged(tokens).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()(tokens).logits
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(base, expected, atol=1e-4)  # the adapter changed something, so the match means a merge


HOLD_TARGETS = """
import contextlib, sys
from pathlib import Path
from mpskit.files import writing
with contextlib.ExitStack() as stack:
    for target in sys.argv[1:]:
        stack.enter_context(writing(Path(target), "-o", "the holder"))
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_writer_of_one_output_is_one_line_naming_the_first(finished_run, tiny_model, tmp_path, capsys):
    """Two commands at once on one output (config -o, export -o, compare --out, tiny-model): the one
    that comes second is one line naming the process that writes there, and writes nothing; once that
    process is done, the same command writes."""
    import subprocess
    import sys

    from mpskit.cli import main

    config, merged, compared, model = (tmp_path / name for name in ("run.yaml", "merged", "compared", "model"))
    commands = {
        config: ["config", "preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}",
                 "-o", str(config)],
        merged: ["export", str(finished_run), "-o", str(merged)],
        compared: ["compare", str(finished_run), "--out", str(compared)],
        model: ["tiny-model", str(model)],
    }  # fmt: skip
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_TARGETS, *map(str, commands)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        for target, words in commands.items():
            assert main(words) == 2
            [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mpskit: error:")]
            assert f"cannot write {target}: it is in use by process {holder.pid} (the holder)" in line, line
            assert "wait until it ends" in line and not target.exists()
    finally:
        holder.communicate("", timeout=60)
    assert main(commands[config]) == 0 and config.is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run.yaml"]  # no lock file left behind


def test_export_refuses_a_folder_that_holds_files(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    result = run_mpskit("export", str(tmp_path / "run"), "-o", str(tmp_path / "taken"), cwd=tmp_path)
    assert result.returncode == 2 and "already exists and is not an empty folder" in result.stderr
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_chat_without_a_finished_adapter_says_so(tmp_path):
    run = tmp_path / "output" / "r" / "20260101-000000"
    run.mkdir(parents=True)
    (run / "mpskit.json").write_text('{"run_name": "r", "stage": "sft", "device": "cpu"}')
    (run / "llamafactory.yaml").write_text("stage: sft\n")
    result = run_mpskit("chat", str(run), "--prompt", "hi", cwd=tmp_path)
    assert result.returncode == 2 and "has no finished adapter (adapter_config.json missing)" in result.stderr
    assert "mpskit train --resume" in result.stderr


@pytest.mark.e2e
def test_eval_judges_runs_on_held_out_pairs_against_the_base_model(finished_run, tiny_model, tmp_path):
    work = tmp_path
    dpo = run_mpskit(
        "train", "preset=dpo", "model_preset=tiny", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}",
        "max_steps=8", "learning_rate=5e-3", "eval_strategy=no", "run_name=dpo", "--hardware", "cpu", cwd=work,
    )  # fmt: skip
    assert dpo.returncode == 0, dpo.stderr[-2000:]
    shutil.copy(ROOT / "data" / "demo_pref_eval.json", work / "pairs.json")  # a plain file, as train takes one
    result = run_mpskit("eval", "output/dpo/latest", str(finished_run), "--dataset", "pairs.json", cwd=work)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in result.stdout.splitlines()]
    header, _, dpo_row, sft_row = rows
    assert header == ["run", "stage", "eval dataset", "eval_rewards/accuracies", "eval_rewards/margins", "eval_loss"]
    assert (dpo_row[1], sft_row[1]) == ("dpo", "sft") and dpo_row[2].endswith("pairs")
    dpo_accuracy, dpo_margin, sft_margin = float(dpo_row[3]), float(dpo_row[4]), float(sft_row[4])
    assert 0 <= float(sft_row[3]) <= 1 and dpo_accuracy > 0.6  # DPO learnt the demo preferences
    assert dpo_margin > 0.05 and dpo_margin > sft_margin  # against the base model, not against itself
    results = {path.resolve() for path in (work / "output" / "dpo").glob(f"*/eval/{dpo_row[2]}-*/all_results.json")}
    assert len(results) == 1  # in the run's folder (also reached through `latest`)


@pytest.mark.e2e
def test_eval_names_a_missing_dataset_or_base_model_in_one_line(finished_run, tmp_path):
    def refused(run_dir: Path, *words: str) -> str:
        result = run_mpskit("eval", str(run_dir), *words, cwd=tmp_path)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        return result.stderr

    evaluations = sorted(finished_run.glob("eval/*"))
    assert "dataset 'nope' is not in" in refused(finished_run, "--dataset", "nope")
    assert "not a preference set" in refused(finished_run, "--dataset", "demo_sft")
    moved = tmp_path / "run"
    shutil.copytree(finished_run, moved, ignore=shutil.ignore_patterns("eval"))  # not another test's results
    written = yaml.safe_load((moved / "llamafactory.yaml").read_text())
    (moved / "llamafactory.yaml").write_text(yaml.safe_dump({**written, "model_name_or_path": str(tmp_path / "gone")}))
    assert "gone not found" in refused(moved, "--dataset", "demo_pref_eval")
    assert sorted(finished_run.glob("eval/*")) == evaluations and not (moved / "eval").exists()


def test_chat_refuses_a_token_count_below_one(tmp_path):
    result = run_mpskit("chat", "--prompt", "hi", "--max-new-tokens", "0", cwd=tmp_path)
    assert result.returncode == 2 and "'0' is not a whole number of at least 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_an_export_killed_before_it_completes_leaves_no_model_at_its_output(finished_run, tmp_path):
    """SIGKILL once LLaMA-Factory's export has written every file, before mpskit calls it complete:
    nothing is at -o (the files stay under their temporary name), and the export can be run again."""
    import signal
    import subprocess
    import sys

    kill_after_export = (
        "import os, signal, sys, llamafactory.train.tuner as tuner; real = tuner.export_model; "
        "tuner.export_model = lambda args: (real(args), os.kill(os.getpid(), signal.SIGKILL)); "
        "from mpskit.cli import main; sys.exit(main())"
    )
    out = tmp_path / "merged"
    killed = subprocess.run([sys.executable, "-c", kill_after_export, "export", str(finished_run), "-o", str(out)],
                            cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists()
    assert [(p / "config.json").is_file() for p in tmp_path.glob(".merged.partial-*")] == [True]
    again = run_mpskit("export", str(finished_run), "-o", str(out))
    assert again.returncode == 0 and (out / "config.json").is_file(), again.stderr[-2000:]


@pytest.mark.e2e
def test_an_export_stopped_by_sigterm_removes_its_temporary_folder(finished_run, tmp_path):
    import signal
    import subprocess
    import sys

    stop_after_export = (
        "import os, signal, sys, llamafactory.train.tuner as tuner; real = tuner.export_model; "
        "tuner.export_model = lambda args: (real(args), os.kill(os.getpid(), signal.SIGTERM)); "
        "from mpskit.cli import main; sys.exit(main())"
    )
    out = tmp_path / "merged"
    out.mkdir()  # the user's empty folder (a mount point, say): the export writes inside it
    stopped = subprocess.run([sys.executable, "-c", stop_after_export, "export", str(finished_run), "-o", str(out)],
                             cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["merged"]


def test_a_merged_model_moves_into_an_empty_folder_on_its_own_file_system_config_last(tmp_path, monkeypatch):
    from mpskit import output_folder
    from mpskit.errors import MpskitError

    out = tmp_path / "disk"
    out.mkdir()
    partial, made = output_folder.make_partial(out, "disk")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (partial / name).write_text(name)
    moved = []
    rename = lambda src, dst: moved.append(Path(dst).name) or os.replace(src, dst)  # noqa: E731
    monkeypatch.setattr(output_folder.os, "rename", rename)
    output_folder.move_into_place(partial, out, made)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert moved[-1] == "config.json" and all(Path(p).parent == out for p in out.iterdir())
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "config.json").write_text("another export's")
    partial, made = output_folder.make_partial(taken, "taken")
    with pytest.raises(MpskitError, match="written by another process meanwhile"):
        output_folder.move_into_place(partial, taken, made)
    beside, made = output_folder.make_partial(tmp_path, "full")
    full = tmp_path / "full"
    for folder in (beside, full):
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(folder.name)
    with pytest.raises(MpskitError, match="written by another process meanwhile"):  # made and filled meanwhile
        output_folder.move_into_place(beside, full, made)
    assert (full / "config.json").read_text() == "full"


@pytest.mark.e2e
def test_eval_of_a_foodpo_run_reports_what_its_training_evaluation_reported(tiny_model, tmp_path, finished_run):
    """fooDPO's margins and loss scale with each pair's own beta: eval judges by the run's own loss
    (with DPO's pref_beta it reported about three times the training's margin for the same adapter)."""
    trained = run_mpskit(
        "train", "preset=foodpo", "model_preset=tiny", f"model_name_or_path={tiny_model}",
        f"dataset_dir={ROOT / 'data'}", "max_steps=4", "eval_steps=4", "learning_rate=5e-3", "run_name=fd",
        "--hardware", "cpu", cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-2000:]
    run_dir = (tmp_path / "output" / "fd" / "latest").resolve()
    training = json.loads((run_dir / "all_results.json").read_text())
    unjudged = tmp_path / "no_held_out"  # the SFT run without its eval_dataset: nothing to judge it on
    shutil.copytree(finished_run, unjudged)
    written = unjudged / "llamafactory.yaml"
    written.write_text("".join(line + "\n" for line in written.read_text().splitlines()
                               if not line.startswith("eval_dataset:")))  # fmt: skip
    both = run_mpskit("eval", str(run_dir), str(unjudged), cwd=tmp_path)
    assert both.returncode == 2 and both.stderr.strip().splitlines()[-1].startswith(f"mpskit: error: {unjudged}")
    assert not (run_dir / "eval").exists()  # refused before the first run's evaluation, not after it
    result = run_mpskit("eval", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [evaluated] = [json.loads(path.read_text()) for path in run_dir.glob("eval/*/all_results.json")]
    for key in ("eval_rewards/accuracies", "eval_rewards/margins", "eval_loss", "eval_dynamic_beta"):
        assert evaluated[key] == pytest.approx(training[key], rel=1e-4), key


def test_compare_takes_the_held_out_figures_mpskit_eval_wrote_for_a_run_trained_without_them(tmp_path):
    import json

    from mpskit.rundir.record import Attempt, RunRecord, write_record
    from mpskit.tools.compare import summarise_run

    run_dir = tmp_path / "output" / "dpo" / "20260101-000000"
    run_dir.mkdir(parents=True)
    finished = [Attempt(1, outcome="finished")]
    write_record(run_dir, RunRecord(run_name="dpo", stage="dpo", device="cpu", attempts=finished))
    (run_dir / "llamafactory.yaml").write_text("stage: dpo\n")
    (run_dir / "all_results.json").write_text('{"train_runtime": 3.0, "train_loss": 0.6}')
    assert summarise_run(run_dir)["eval_rewards/accuracies"] is None
    scored = run_dir / "eval" / "pairs-20260101-010000"
    scored.mkdir(parents=True)
    (scored / "all_results.json").write_text(json.dumps({"eval_rewards/accuracies": 0.75, "eval_rewards/margins": 0.2}))
    row = summarise_run(run_dir)
    assert row["eval_rewards/accuracies"] == 0.75 and row["eval_rewards/log_ratio_gap"] == pytest.approx(2.0)


@pytest.mark.e2e
def test_a_full_fine_tune_is_chatted_with_and_exported_from_its_own_folder(tmp_path, tiny_model):
    import torch
    from gguf_checks import assert_agrees_as_f16, prompt_ids
    from transformers import AutoModelForCausalLM

    words = ["train", "preset=sft", "model_preset=tiny", f"model_name_or_path={tiny_model}", "finetuning_type=full",
             f"dataset_dir={ROOT / 'data'}", "max_steps=1", "eval_strategy=no", "run_name=full", "--hardware", "cpu"]
    trained = run_mpskit(*words, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run_dir = (tmp_path / "output" / "full" / "latest").resolve()
    assert (run_dir / "model.safetensors").is_file() and not (run_dir / "adapter_config.json").exists()
    chat = run_mpskit("chat", str(run_dir), "--prompt", "hi", "--max-new-tokens", "4", cwd=tmp_path)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr[-2000:]
    exported = run_mpskit("export", str(run_dir), "--gguf", "f16", "-o", str(tmp_path / "gguf"), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]  # the run folder is the model, for llama.cpp too
    trained = AutoModelForCausalLM.from_pretrained(run_dir, dtype=torch.float32).eval()
    assert_agrees_as_f16(tmp_path / "gguf" / "full.f16.gguf", trained, prompt_ids(run_dir))


@pytest.mark.e2e
def test_an_export_killed_mid_write_leaves_its_hidden_copy_which_the_next_export_clears(finished_run, tmp_path):
    """SIGKILL once the merged model is written, under its hidden name, into the user's empty folder
    (plugins/faults.py): only `.NAME.partial-PID` is there; the next export removes it (its process
    is gone), says so, and writes."""
    import signal

    out = tmp_path / "merged"
    out.mkdir()
    killed = run_mpskit("export", str(finished_run), "-o", str(out), env={"MPSKIT_FAKE_KILL_BEFORE_MOVE": "1"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    [leftover] = list(out.iterdir())
    assert leftover.name.startswith(".merged.partial-") and (leftover / "config.json").is_file()
    again = run_mpskit("export", str(finished_run), "-o", str(out), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"removed {leftover}, left by a writer of merged that was killed" in again.stderr
    assert (out / "config.json").is_file() and not leftover.exists()
