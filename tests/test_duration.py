"""How long a run takes: steps counted as the trainer counts them, the profiles' figures, the plan's
duration, `mpskit plan --probe` on the tiny model, and the prediction and measurement in mpskit.json.
How close the predictions come is bench/duration.py's to measure, not a timed test's."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_mpskit

from mpskit.datasets.dataset_checks import training_rows
from mpskit.machine.hardware import load_hardware, profile_names
from mpskit.plan.duration import (
    DEFAULT_THROUGHPUT,
    cpu_default,
    extrapolate,
    format_seconds,
    optimizer_steps,
    throughput_for,
    train_examples,
)

DATA = ROOT / "data"


@pytest.mark.parametrize(
    ("args", "examples", "world", "steps"),
    [
        ({"max_steps": 7, "num_train_epochs": 3}, 1000, 1, 7),
        ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "num_train_epochs": 3}, 264, 1, 99),
        ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "num_train_epochs": 1}, 17, 1, 3),
        ({"per_device_train_batch_size": 4, "num_train_epochs": 0.5}, 100, 1, 13),
        ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}, 100, 2, 39),  # 3 epochs by default
        ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 8, "num_train_epochs": 2}, 3, 1, 2),
        ({"num_train_epochs": 1}, None, 1, None),
    ],
)
def test_steps_are_counted_as_the_trainer_counts_them(args, examples, world, steps):
    assert optimizer_steps(args, examples, world) == steps


def test_val_size_takes_its_share_before_training():
    assert train_examples({"val_size": 0.1}, 264) == 237  # ceil(26.4) held out, as train_test_split
    assert train_examples({"val_size": 20}, 264) == 244
    assert train_examples({}, 264) == 264


def test_rows_are_counted_in_local_json_files_only(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"instruction": "q", "output": "a"}] * 30))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"instruction": "q", "output": "a"}) for _ in range(7)))
    (tmp_path / "c.csv").write_text("instruction,output\nq,a\n")
    info = {name: {"file_name": f"{name}.{ext}"} for name, ext in (("a", "json"), ("b", "jsonl"), ("c", "csv"))}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    args = {"dataset_dir": str(tmp_path)}
    assert training_rows({**args, "dataset": "a,b"}) == 37
    assert training_rows({**args, "dataset": "a,b", "max_samples": 10}) == 17  # per dataset, as LLaMA-Factory
    assert training_rows({**args, "dataset": "a,c"}) is None  # a CSV: LLaMA-Factory's to count
    assert training_rows({**args, "dataset": "missing"}) is None
    text = run_mpskit("plan", "preset=sft", "model_preset=qwen2.5-0.5b", "--hardware", "m1-pro-16gb",
                      f"dataset_dir={tmp_path}", "dataset=c").stdout  # fmt: skip
    assert "steps unknown" in text and "set max_steps" in text


def test_whole_runs_extrapolate_from_the_warm_up_and_the_median_step():
    timed = [3.0, 1.0, 1.2, 0.9]
    assert extrapolate(timed, 20) == pytest.approx(3.0 + 19 * 1.0)
    assert extrapolate(timed, 2) == pytest.approx(4.0)  # a run shorter than the probe: its own steps
    assert [format_seconds(s) for s in (0.034, 4.26, 42, 600, 3 * 3600 + 300)] == [
        "0.03 s", "4.3 s", "42 s", "10 min", "3 h 05 min"
    ]  # fmt: skip


def test_every_profile_has_throughput_figures_that_say_where_they_come_from():
    for name in profile_names():
        figures = load_hardware(name).throughput
        assert figures["flops_per_s"] > 0 and figures["step_overhead_s"] >= 0, name
        measured = figures.get("measured", False)
        assert figures["source"].startswith("measured" if measured else "unmeasured:"), name


def test_a_profile_s_figures_apply_to_its_own_device_only():
    m1 = load_hardware("m1-pro-16gb")
    assert throughput_for(m1.throughput, m1.device, "mps").flops_per_s == m1.throughput["flops_per_s"]
    on_cpu = throughput_for(m1.throughput, m1.device, "cpu")  # device=cpu on a Mac: the cpu profile's, unmeasured
    assert on_cpu == cpu_default() and on_cpu.source.startswith("unmeasured:") and not on_cpu.measured
    figures = load_hardware("cpu").throughput
    assert (on_cpu.flops_per_s, on_cpu.quantized_weight_s) == (figures["flops_per_s"], figures["quantized_weight_s"])


def test_a_4_bit_duration_is_given_only_where_a_4_bit_step_was_measured():
    words = ["stage=sft", "model_preset=qwen2.5-7b", "cutoff_len=512", "quantization_bit=4", f"dataset_dir={DATA}"]
    mac = plan_json(*words, "--hardware", "m1-pro-16gb")["duration"]
    assert mac["predicted_step_s"] is None and mac["predicted_s"] is None and "4-bit" in mac["unmeasured"]
    text = run_mpskit("plan", *words, "--hardware", "m1-pro-16gb").stdout
    assert "duration   unknown: 4-bit steps have no measured figure on mps" in text
    assert f"mpskit plan {' '.join(words)} --hardware m1-pro-16gb --probe" in text  # the probe's command, whole
    cpu = plan_json(*words, "--hardware", "cpu")["duration"]  # measured on the cpu profile's machine
    assert cpu["predicted_step_s"] > 0 and cpu["unmeasured"] == ""
    assert all(DEFAULT_THROUGHPUT[device].quantized_weight_s is None for device in ("mps", "cuda"))


def plan_json(*words: str, cwd: Path = ROOT) -> dict:
    result = run_mpskit("plan", "--json", *words, cwd=cwd)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_plan_predicts_the_step_and_the_run_from_the_profiles_figures():
    words = ["preset=sft", "model_preset=qwen2.5-0.5b", f"dataset_dir={DATA}", "dataset=demo_sft"]
    m1 = plan_json(*words, "--hardware", "m1-pro-16gb")
    duration = m1["duration"]
    rows = len(json.loads((DATA / "demo_sft.json").read_text()))
    assert duration["examples"] == rows and duration["epochs"] == 3.0
    assert duration["steps"] == optimizer_steps({"num_train_epochs": 3, **m1["chosen"]["knobs"]} | {
        "per_device_train_batch_size": m1["chosen"]["knobs"]["batch"],
        "gradient_accumulation_steps": m1["effective_batch"] // m1["chosen"]["knobs"]["batch"]}, rows)  # fmt: skip
    assert duration["predicted_s"] == pytest.approx(duration["steps"] * duration["predicted_step_s"], rel=1e-3)
    assert duration["source"].startswith("unmeasured:") and duration["measured_figures"] is False
    # the same model on a faster machine: the same steps, each shorter
    m4 = plan_json(*words, "--hardware", "m4-max-128gb")["duration"]
    assert m4["steps"] == duration["steps"] and m4["predicted_step_s"] < duration["predicted_step_s"]
    text = run_mpskit("plan", *words, "max_steps=50", "--hardware", "m1-pro-16gb").stdout
    assert "per optimizer step, 50 steps (max_steps)" in text and "mpskit plan --probe" in text


# The probes that share the system's temporary folder run on one worker: a probe running beside this check
# would hold its own mpskit-probe-* folder there (seen once in make test)
SHARED_TMP = pytest.mark.xdist_group("probes in the system's temporary folder")


@pytest.mark.e2e
@SHARED_TMP
def test_probe_times_real_steps_and_leaves_nothing_behind(tmp_path, tiny_model):
    before = set(Path(tempfile.gettempdir()).glob("mpskit-probe-*"))
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={DATA}", "template=qwen", "max_steps=20"]
    plan = plan_json(*words, "--probe", cwd=tmp_path)
    probe = plan["probe"]
    assert len(probe["step_seconds"]) == 4 and all(s > 0 for s in probe["step_seconds"])
    assert probe["predicted_s"] == pytest.approx(extrapolate(probe["step_seconds"], 20), abs=0.1)
    assert probe["startup_s"] > 0
    assert list(tmp_path.iterdir()) == []  # no output/ folder, no latest link
    assert set(Path(tempfile.gettempdir()).glob("mpskit-probe-*")) == before
    text = run_mpskit("plan", *words, "--probe", cwd=tmp_path)
    assert text.returncode == 0 and "per optimizer step measured here (median of 3" in text.stdout


@pytest.mark.e2e
@SHARED_TMP
def test_a_probe_that_fails_says_why_in_one_line(tmp_path, tiny_model):
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tiny_model / "config.json").read_text())
    words = ["preset=sft", f"model_name_or_path={no_weights}", f"dataset_dir={DATA}", "template=qwen"]
    result = run_mpskit("plan", *words, "--probe", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the probe failed" in result.stderr.strip().splitlines()[-1], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-weights"]


@pytest.mark.e2e
def test_sigterm_during_a_probe_leaves_no_temporary_folder(tmp_path, tiny_model):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={DATA}", "template=qwen", "max_steps=20"]
    env = {**os.environ, "TMPDIR": str(temporary), "HF_HUB_OFFLINE": "1"}
    child = subprocess.Popen([sys.executable, "-m", "mpskit.cli", "plan", *words, "--probe"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 300  # a guard against a hang, not a speed target
    while not list(temporary.glob("mpskit-probe-*/run/mpskit.json")):  # the probe's run is under way
        assert time.time() < deadline and child.poll() is None, "the probe never started"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr[-2000:]
    assert not list(temporary.glob("mpskit-*"))  # torch may leave its own cache (torchinductor_<user>) there
