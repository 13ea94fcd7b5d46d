"""fooDPO end to end through `mpskit train`, against LLaMA-Factory's own DPO."""

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_llamafactory_cli, run_mpskit
from test_e2e import FAST, assert_trained, llamafactory_cli_train, losses

from mpskit.settings.foodpo import FOODPO_KEYS

pytestmark = pytest.mark.e2e
SHORT = [*FAST, "max_steps=8", "logging_steps=1", "eval_strategy=no", "save_steps=1000"]


def test_scale_zero_gives_exactly_llamafactory_dpo(tmp_path, tiny_model):
    done, dpo_dir = llamafactory_cli_train(tmp_path, "preset=dpo", f"model_name_or_path={tiny_model}", *SHORT)
    assert done.returncode == 0, done.stderr[-3000:]

    foo = run_mpskit(
        "train", "preset=foodpo", "pref_beta_scale=0", f"model_name_or_path={tiny_model}", *SHORT, cwd=tmp_path
    )
    assert foo.returncode == 0, foo.stderr[-3000:]
    foo_dir = (tmp_path / "output" / "foodpo-model" / "latest").resolve()

    dpo_losses, foo_losses = losses(dpo_dir), losses(foo_dir)
    assert len(dpo_losses) == len(foo_losses) == 8
    assert foo_losses == pytest.approx(dpo_losses, abs=1e-6)


def test_foodpo_learns_and_logs_its_beta(tmp_path, tiny_model):
    result = run_mpskit(
        "train", "preset=foodpo", "pref_beta_scale=0.2", f"model_name_or_path={tiny_model}", *FAST, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = (tmp_path / "output" / "foodpo-model" / "latest").resolve()
    assert_trained(run_dir)
    results = json.loads((run_dir / "all_results.json").read_text())
    assert results["eval_rewards/accuracies"] > 0.5
    rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    train_rows = [row for row in rows if "loss" in row]
    # each epoch's end evaluated, once: the workflow's evaluation after training used to run the last again
    [attempt] = json.loads((run_dir / "mpskit.json").read_text())["attempts"]
    assert len(attempt["measured"]["eval_spans_s"]) == 2
    assert [row["eval_loss"] for row in rows if "eval_loss" in row][-1] == results["eval_loss"]
    for row in train_rows:
        assert {"prompt_perplexity", "log_prompt_perplexity", "dynamic_beta", "rewards/margins"} <= row.keys()
        expected = 0.1 * 0.2 * max(row["log_prompt_perplexity"], 0)
        assert row["dynamic_beta"] == pytest.approx(expected, rel=0.05)  # mean of products ~ product of means
    assert (run_dir / "foodpo_beta_margin.png").stat().st_size > 10_000
    written = yaml.safe_load((run_dir / "llamafactory.yaml").read_text())
    assert written["stage"] == "foodpo" and written["pref_beta_scale"] == 0.2

    compared = run_mpskit("compare", "--out", str(tmp_path / "cmp"), str(run_dir), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    with open(tmp_path / "cmp" / "comparison.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["pref_beta_scale"]) == 0.2
    assert float(row["eval_rewards/accuracies"]) == results["eval_rewards/accuracies"]
    assert float(row["eval_rewards/log_ratio_gap"]) == results["eval_rewards/log_ratio_gap"]
    assert (tmp_path / "cmp" / "comparison.png").is_file() and "| foodpo |" in compared.stdout


def test_plain_llamafactory_refuses_a_foodpo_yaml(tmp_path, tiny_model):
    """Never a silent plain-DPO run: LLaMA-Factory refuses fooDPO's keys, and without them its stage."""
    done, _ = llamafactory_cli_train(tmp_path, "preset=foodpo", f"model_name_or_path={tiny_model}", *SHORT)
    assert done.returncode != 0 and "keys are not used by the HfArgumentParser" in done.stderr, done.stderr[-2000:]
    assert "pref_beta_scale" in done.stderr.splitlines()[-1]
    written = tmp_path / "llamafactory.yaml"
    args = {key: value for key, value in yaml.safe_load(written.read_text()).items() if key not in FOODPO_KEYS}
    written.write_text(yaml.safe_dump(args))
    stage_only = run_llamafactory_cli("train", str(written), cwd=tmp_path)
    assert stage_only.returncode != 0 and stage_only.stderr.splitlines()[-1].endswith("Unknown task: foodpo.")


def test_foodpo_script_runs_with_its_knobs(tmp_path, tiny_model):
    """Run directly, with no environment activated (it finds the checkout's .venv), on a data file of
    the user's (no demo held-out set then: a file is evaluated as mpskit train evaluates one)."""
    pairs = tmp_path / "pairs.jsonl"
    rows = json.loads((ROOT / "data" / "demo_pref.json").read_text())
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    knobs = {
        "MODEL_PATH": str(tiny_model),
        "MODEL_PRESET": "tiny",
        "DATA": str(pairs),
        "BETA_SCALE": "0.1",
        "MAX_SEQ_LEN": "128",
        "LORA_RANK": "4",
        "LR": "5e-3",
        "RUN_NAME": "script",
    }
    script = ROOT / "scripts" / "test_qwen_foodpo.sh"
    folders = os.environ["PATH"].split(os.pathsep)
    path = os.pathsep.join(folder for folder in folders if not Path(folder, "mpskit").exists())  # no mpskit there
    done = subprocess.run(
        ["bash", str(script), "max_steps=4", "logging_steps=1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, **knobs, "PATH": path},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    written = yaml.safe_load((tmp_path / "output" / "script" / "latest" / "llamafactory.yaml").read_text())
    assert (written["stage"], written["pref_beta_scale"], written["lora_rank"], written["cutoff_len"]) == (
        "foodpo",
        0.1,
        4,
        128,
    )
    assert "demo_pref_eval" not in str(written.get("eval_dataset"))
    assert losses(tmp_path / "output" / "script" / "latest")


def test_seed_command_line_style_is_accepted(tmp_path, tiny_model):
    result = run_mpskit(
        "config",
        "--stage",
        "foodpo",
        "--pref_beta",
        "0.1",
        "--pref_beta_scale",
        "0.05",
        "--fp16",
        "false",
        "--use_mps_device",
        "true",
        "--model_name_or_path",
        str(tiny_model),
        "--template",
        "qwen",
        "--dataset_dir",
        str(ROOT / "data"),
        "--dataset",
        "demo_pref",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "use_mps_device" in result.stderr and "warning" in result.stderr
    args = yaml.safe_load(result.stdout)
    assert args["stage"] == "foodpo" and args["pref_beta_scale"] == 0.05 and "use_mps_device" not in args


def test_comparison_labels_keep_runs_with_the_same_stage_and_scale_apart():
    from mpskit.tools.compare import distinct_labels

    runs = [{"stage": "dpo", "pref_beta_scale": "-", "run": "a/1"},
            {"stage": "foodpo", "pref_beta_scale": 0.05, "run": "b/1"},
            {"stage": "foodpo", "pref_beta_scale": 0.05, "run": "b/2"},
            {"stage": "foodpo", "pref_beta_scale": 0.05, "run": "b/2"}]  # fmt: skip
    labels = distinct_labels(runs)
    assert labels[0] == "dpo" and len(set(labels)) == 4
    assert labels[1] == "foodpo scale 0.05 (b/1)" and labels[3] == "foodpo scale 0.05 (b/2) #4"
