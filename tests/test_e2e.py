"""Real LLaMA-Factory training on the tiny model, through `mpskit train` and through plain
`llamafactory-cli train` on the YAML mpskit writes."""

import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_llamafactory_cli, run_mpskit

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(__name__)]
FAST = ["learning_rate=5e-3", "num_train_epochs=2", "cutoff_len=128", f"dataset_dir={ROOT / 'data'}", "template=qwen"]


def train(tmp_path: Path, tiny_model: Path, stage: str) -> Path:
    result = run_mpskit("train", f"preset={stage}", f"model_name_or_path={tiny_model}", *FAST, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return (tmp_path / "output" / f"{stage}-model" / "latest").resolve()


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def assert_trained(run_dir: Path) -> None:
    for name in ("adapter_model.safetensors", "adapter_config.json", "loss.png", "llamafactory.yaml"):
        assert (run_dir / name).is_file(), name
    logged = losses(run_dir)
    assert len(logged) >= 3 and all(math.isfinite(x) for x in logged)
    assert (run_dir / "loss.png").stat().st_size > 10_000
    assert not (run_dir / "training_loss.png").exists()  # LLaMA-Factory's smoothed plot is off


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, tiny_model) -> Path:
    return train(tmp_path_factory.mktemp("sft"), tiny_model, "sft")


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory, tiny_model) -> Path:
    return train(tmp_path_factory.mktemp("dpo"), tiny_model, "dpo")


def test_sft_trains_and_its_loss_falls(sft_run):
    assert_trained(sft_run)
    logged = losses(sft_run)
    assert logged[-1] < logged[0]


def test_run_directory_records_what_was_chosen(sft_run):
    record = json.loads((sft_run / "mpskit.json").read_text())
    assert record["stage"] == "sft" and record["device"] == "cpu" and record["mps_hidden"] is True
    assert record["versions"]["llamafactory"] == "0.9.5"
    written = yaml.safe_load((sft_run / "llamafactory.yaml").read_text())
    # relative to where mpskit ran: nothing in a run folder names the folder by an absolute path
    assert written["output_dir"] == f"output/sft-model/{sft_run.name}" and written["use_cpu"] is True
    assert (sft_run.parent / "latest").is_symlink()


def test_the_planner_chose_the_free_knobs_and_the_monitor_measured_them(sft_run):
    record = json.loads((sft_run / "mpskit.json").read_text())
    memory = record["memory"]
    written = yaml.safe_load((sft_run / "llamafactory.yaml").read_text())
    # the stage preset asks for batch 4 x accumulation 2; the tiny model fits anything, so the planner
    # takes the whole effective batch at once without checkpointing
    assert written["per_device_train_batch_size"] * written["gradient_accumulation_steps"] == 8
    assert written["disable_gradient_checkpointing"] is True
    assert memory["planner_changes"] and memory["predicted"]["training_gb"] <= memory["budget_gb"]
    measured = memory["measured"]
    assert measured["device"] == "cpu" and 0 < measured["training_gb"] < 2
    assert measured["peak_gb"] >= measured["baseline_gb"] + measured["training_gb"] - 1e-3
    assert memory["error"] == pytest.approx(
        (memory["predicted"]["training_gb"] - measured["training_gb"]) / measured["training_gb"], abs=1e-3
    )
    rows = [json.loads(line) for line in (sft_run / "trainer_log.jsonl").read_text().splitlines()]
    peaks = [row["memory_training_gb"] for row in rows if "loss" in row]  # the same figure, so far
    assert peaks and peaks == sorted(peaks) and 0 < peaks[-1] <= measured["training_gb"]
    assert (sft_run / "memory.png").stat().st_size > 10_000


def test_the_run_records_its_predicted_and_measured_duration(sft_run):
    """The steps predicted before the run are the steps the trainer ran (epochs over the demo set),
    and the measured time is the monitor's, summed over its steps."""
    duration = json.loads((sft_run / "mpskit.json").read_text())["duration"]
    memory = json.loads((sft_run / "mpskit.json").read_text())["memory"]
    rows = [json.loads(line) for line in (sft_run / "trainer_log.jsonl").read_text().splitlines()]
    assert duration["steps"] == rows[-1]["total_steps"] == duration["measured_steps"]
    assert duration["predicted_s"] == pytest.approx(duration["steps"] * duration["predicted_step_s"], abs=0.1)
    assert duration["measured_s"] == pytest.approx(sum(memory["measured"]["step_seconds"]), abs=0.05)
    assert duration["error"] == pytest.approx(
        (duration["predicted_s"] - duration["measured_s"]) / duration["measured_s"], abs=1e-2
    )


def test_dpo_learns_the_held_out_preference(dpo_run):
    assert_trained(dpo_run)
    results = json.loads((dpo_run / "all_results.json").read_text())
    assert results["eval_rewards/accuracies"] > 0.5
    assert results["eval_rewards/margins"] > 0
    # the log-ratio gap is the margin with DPO's one beta (0.1) factored out, step by step
    assert results["eval_rewards/margins"] == pytest.approx(0.1 * results["eval_rewards/log_ratio_gap"], rel=1e-4)
    rows = [json.loads(line) for line in (dpo_run / "trainer_log.jsonl").read_text().splitlines()]
    for row in (row for row in rows if "loss" in row):
        assert row["rewards/margins"] == pytest.approx(0.1 * row["rewards/log_ratio_gap"], rel=1e-4, abs=1e-7)
    assert (dpo_run / "rewards.png").stat().st_size > 10_000


def test_a_second_run_never_touches_the_first(tmp_path, tiny_model):
    first = train(tmp_path, tiny_model, "sft")
    before = sorted(p.name for p in first.iterdir())
    second = train(tmp_path, tiny_model, "sft")
    assert second != first and sorted(p.name for p in first.iterdir()) == before


def llamafactory_cli_train(tmp_path: Path, *words: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`mpskit config WORDS -o x.yaml`, then plain `llamafactory-cli train x.yaml`; (result, output_dir)."""
    config = tmp_path / "llamafactory.yaml"
    made = run_mpskit("config", *words, "-o", str(config), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    done = run_llamafactory_cli("train", str(config), cwd=tmp_path)
    out = Path(yaml.safe_load(config.read_text())["output_dir"])
    return done, out if out.is_absolute() else tmp_path / out


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_written_yaml_runs_unchanged_with_llamafactory_cli(tmp_path, tiny_model, stage):
    done, out = llamafactory_cli_train(
        tmp_path, f"preset={stage}", f"model_name_or_path={tiny_model}", *FAST, "num_train_epochs=1"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    assert all(math.isfinite(x) for x in losses(out))
