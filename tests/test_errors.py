"""Bad inputs end with one line naming the problem and the fix, exit code 2, no traceback."""

import json

import pytest
from conftest import ROOT, run_mpskit


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and "warning" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mpskit: error:") and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unknown_key_suggests_the_closest(tiny_model):
    result = run_mpskit("config", "preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", "lora_rnak=4")
    assert_one_line_error(result, "unknown key 'lora_rnak'", "did you mean 'lora_rank'")


def test_missing_model_path_names_model_path_and_demo(tmp_path):
    result = run_mpskit("config", "preset=sft", f"model_name_or_path={tmp_path / 'nope'}")
    assert_one_line_error(result, "MODEL_PATH", "make demo")


def test_unreachable_hub_id_names_model_path_and_demo():
    result = run_mpskit("train", "preset=sft", "model_preset=qwen1.5-0.5b")
    assert_one_line_error(result, "Qwen/Qwen1.5-0.5B", "MODEL_PATH", "make demo")


def test_planning_an_uncached_hub_model_without_network_is_one_line_at_once():
    """Without HF_HUB_OFFLINE, huggingface_hub would retry for 24 s, printing a line each time."""
    import time

    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens there
    started = time.monotonic()
    result = run_mpskit("plan", "preset=sft", "model_name_or_path=Org/not-cached-here", "template=qwen", env=env)
    assert time.monotonic() - started < 10
    assert_one_line_error(result, "Org/not-cached-here", "not cached and the hub cannot be reached")
    assert result.stderr.count("\n") == 1, result.stderr


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("stage: sft\n  lora_rank: [4\n")
    result = run_mpskit("config", str(bad))
    assert_one_line_error(result, "not valid YAML", "line")


def test_dataset_missing_from_dataset_info(tiny_model):
    result = run_mpskit("config", "preset=sft", f"model_name_or_path={tiny_model}", "dataset=nope")
    assert_one_line_error(result, "dataset 'nope'", "dataset_info.json", "demo_sft")


@pytest.mark.parametrize(
    ("words", "needle"),
    [
        (["preset=sft", "model_preset=tiny", "--hardware", "m9-ultra"], "unknown hardware preset"),
        (["preset=nonsense", "model_preset=tiny"], "unknown stages preset"),
        (["preset=sft", "model_preset=qwen9"], "unknown models preset"),
        (["model_preset=tiny"], "no stage given"),
    ],
)
def test_unknown_presets(words, needle):
    assert_one_line_error(run_mpskit("config", *words), needle)


def test_train_refuses_an_existing_output_dir_and_leaves_it_alone(tiny_model, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("two hours of training")
    result = run_mpskit("train", "preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", f"output_dir={out}")
    assert_one_line_error(result, "already holds files")
    assert (out / "keep.txt").read_text() == "two hours of training" and len(list(out.iterdir())) == 1


def test_help_is_fast_and_clean():
    result = run_mpskit("--help")
    assert result.returncode == 0 and "train" in result.stdout
    assert "rank" not in result.stdout  # the command torchrun starts is not the user's


def test_version():
    from mpskit import __version__

    result = run_mpskit("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"mpskit {__version__}"


def test_config_writes_a_file(tiny_model, tmp_path):
    out = tmp_path / "lf.yaml"
    result = run_mpskit("config", "preset=dpo", f"model_name_or_path={tiny_model}", "template=qwen", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "stage: dpo" in out.read_text()
    assert ROOT.as_posix() in out.read_text()  # dataset_dir made absolute
    words = ["config", "preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", "-o", str(out)]
    assert run_mpskit(*words).returncode == 2 and "stage: dpo" in out.read_text()  # never replaced unasked
    assert run_mpskit(*words, "--force").returncode == 0 and "stage: sft" in out.read_text()


def test_config_for_a_hub_model_needs_no_download(tmp_path):
    out = tmp_path / "dpo.yaml"
    data = f"dataset_dir={ROOT / 'data'}"
    result = run_mpskit("config", "preset=dpo", "model_preset=qwen2.5-0.5b", data, "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        "Qwen/Qwen2.5-0.5B is not downloaded" in result.stderr
        and "model_name_or_path: Qwen/Qwen2.5-0.5B" in out.read_text()
    )
    refused = run_mpskit("train", "preset=dpo", "model_preset=qwen2.5-0.5b", data, cwd=tmp_path)  # train still checks
    assert refused.returncode == 2 and "MODEL_PATH" in refused.stderr


BOUNDARY_RUN = ["preset=sft", "template=qwen", f"dataset_dir={ROOT / 'data'}", "dataset=demo_sft", "cutoff_len=64",
                "max_steps=3", "eval_dataset=", "eval_strategy=no", "logging_steps=1"]  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpskit: error:")]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "words, needles",
    [
        (["lr_scheduler_type=cosine_with_min_lr"], ["transformers (ValueError)", "min_lr"]),
        (["preprocessing_num_workers=0"], ["datasets (ValueError)", "num_proc must be an integer > 0"]),
        (["save_strategy=best"], ["transformers (ValueError)", "metric_for_best_model", "change save_strategy=best"]),
    ],
)  # fmt: skip
def test_a_library_error_before_the_first_step_is_one_line_with_the_traceback_in_train_log(
    words, needles, tmp_path, tiny_model
):
    result = run_mpskit("train", *BOUNDARY_RUN, f"model_name_or_path={tiny_model}", *words, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    [line] = error_lines(result.stderr)
    assert all(needle in line for needle in needles) and "(before the first step ended)" in line, line
    [log] = (tmp_path / "output").glob("*/*/train.log")
    assert "mpskit: the error in full:" in log.read_text() and "Traceback" in log.read_text()


# A library failure that no check of mpskit's knows, injected where LLaMA-Factory loads the tokenizer, and one
# in the third training step: the boundary, not a list of cases, turns each into its line.
INJECT = """
import sys, transformers, llamafactory.train.sft.workflow as workflow
where = sys.argv.pop(1)
if where == "loading":
    def load_tokenizer(model_args):
        raise ValueError("a fresh problem that no check knows")
    workflow.load_tokenizer = load_tokenizer
else:
    real, calls = transformers.Trainer.training_step, []
    def training_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("a fresh failure in step 3")
        return real(self, *args, **kwargs)
    transformers.Trainer.training_step = training_step
from mpskit.cli import main
sys.exit(main())
"""


@pytest.mark.e2e
def test_a_fresh_library_failure_is_one_line_before_training_and_a_failed_run_after(tmp_path, tiny_model):
    import subprocess
    import sys

    def train(where: str, name: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", INJECT, where, "train", *BOUNDARY_RUN, f"model_name_or_path={tiny_model}",
                   "save_steps=2", f"run_name={name}", "-v" if where == "loading" else "logging_steps=1"]  # fmt: skip
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)

    loading = train("loading", "loading")
    assert loading.returncode == 2, loading.stderr[-3000:]
    [line] = error_lines(loading.stderr)
    assert "(ValueError): a fresh problem that no check knows (before the first step ended)" in line
    assert "Traceback" in loading.stderr  # -v: the whole traceback on stderr as well
    stepping = train("stepping", "stepping")
    assert stepping.returncode == 1 and "Traceback" not in stepping.stderr, stepping.stderr[-3000:]
    [line] = error_lines(stepping.stderr)
    assert "the run failed after step 2: " in line and "(RuntimeError): a fresh failure in step 3" in line
    assert "the newest complete checkpoint is checkpoint-2" in line and "mpskit train --resume" in line
    run_dir = (tmp_path / "output" / "stepping").glob("*/mpskit.json")
    assert json.loads(next(run_dir).read_text())["attempts"][-1]["outcome"] == "error: RuntimeError"


def test_a_library_error_outside_a_run_is_one_line_and_the_traceback_only_with_v(tmp_path, monkeypatch, capsys):
    from mpskit import cli
    from mpskit.tools import use_run

    def export(run_dir, out_dir, allow_unfinished=False):
        raise ValueError("a fresh problem while merging\nwith more lines")

    monkeypatch.setattr(use_run, "export", export)
    monkeypatch.setenv("MPSKIT_VERBOSE", "0")  # restored after the test: -v below sets it
    assert cli.main(["export", str(tmp_path), "-o", str(tmp_path / "merged")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "mpskit: error: ValueError: a fresh problem while merging; rerun with -v for the whole traceback"
    assert cli.main(["-v", "export", str(tmp_path), "-o", str(tmp_path / "merged")]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_library_errors_line_names_a_setting_by_whole_word_and_a_data_error_its_data():
    from mpskit.run.boundary import named_setting

    args = {"dataset": "demo_sft", "dataset_dir": "/data", "lora_rank": 8, "template": "qwen"}
    assert named_setting("cannot import datasets.py from the working folder", args) is None
    assert named_setting("lora_rank must divide the hidden size", args) == "lora_rank=8"
    assert named_setting("template qwen has no system turn", args) == "template=qwen"
    assert named_setting("Couldn't cast the column", args, "datasets") == "dataset=demo_sft (in /data)"


def test_a_ctrl_c_at_any_moment_of_a_command_is_one_line(monkeypatch, capsys):
    """Even while a summary or an error line prints (outside every handler of the command's own)."""
    from mpskit import cli

    def interrupted(argv):
        try:
            raise cli.MpskitError("a problem", "a fix")
        except cli.MpskitError:
            raise KeyboardInterrupt from None  # a second Ctrl-C while the first one's lines print

    monkeypatch.setattr(cli, "_main", interrupted)
    assert cli.main(["train"]) == 130
    assert capsys.readouterr().err.strip() == "mpskit: interrupted"
