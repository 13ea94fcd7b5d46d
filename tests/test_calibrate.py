"""`mpskit calibrate`: this machine's step-time figures fitted to timed steps, kept for this machine only."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import run_mpskit

from mpskit.errors import MpskitError
from mpskit.machine import calibration
from mpskit.machine.hardware import detect, load_hardware
from mpskit.plan.duration import throughput_for
from mpskit.plan.memory import ModelDims
from mpskit.presets import model_folder
from mpskit.settings.knobs import Knobs
from mpskit.trials.calibrate import CASES, PRESET
from mpskit.trials.time_fit import FITTED, TimedStep, fit_figures, predicted_step_s

# The real model's shapes (configs/models/smollm2-135m.yaml), its bf16 checkpoint computed as stored.
SMOLLM2 = ModelDims(576, 30, 9, 3, 1536, 49152, checkpoint_dtype="bf16", model_type="llama")
# calibrate.CASES' settings: (stage, cutoff_len, batch, bits)
SETTINGS = [("sft", 256, 4, None), ("sft", 512, 2, None), ("dpo", 256, 4, None), ("sft", 256, 4, 4), ("sft", 512, 2, 4)]


def cpu_figures():
    return throughput_for(load_hardware("cpu").throughput, "cpu", "cpu")


def steps_timed_as(speed, settings=SETTINGS, device="cpu", dtype="fp32") -> list[TimedStep]:
    """The settings' steps as if SPEED's figures had timed them on DEVICE."""
    steps = [TimedStep({}, stage, SMOLLM2, Knobs(batch, cutoff, checkpointing=False, quantization_bit=bits,
                                                 dtype=dtype), batch, None, 0.0)
             for stage, cutoff, batch, bits in settings]  # fmt: skip
    return [replace(step, seconds=predicted_step_s(step, speed, device)) for step in steps]


def test_the_fit_finds_the_figures_that_timed_the_steps():
    profile = cpu_figures()
    truth = replace(profile, half_work=0.3, half_layer_s=0.002, quantized_weight_s=3e-9, quantized_work=0.7)
    fitted = fit_figures(steps_timed_as(truth), profile, "measured here")
    for name in FITTED:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert (fitted.flops_per_s, fitted.step_overhead_s) == (profile.flops_per_s, profile.step_overhead_s)
    assert fitted.measured and fitted.source == "measured here"
    assert fitted.quantized_work != profile.quantized_work  # the fit moved it, not the profile


def test_a_figure_no_step_exercises_stays_the_device_s():
    profile = cpu_figures()
    truth = replace(profile, half_work=0.3, half_layer_s=0.002)
    fitted = fit_figures(steps_timed_as(truth, SETTINGS[:3]), profile, "measured here")  # 16 bits only
    assert fitted.half_work == pytest.approx(0.3) and fitted.half_layer_s == pytest.approx(0.002)
    assert (fitted.quantized_weight_s, fitted.quantized_work) == (profile.quantized_weight_s, profile.quantized_work)


def test_a_detected_machine_plans_with_its_own_calibration_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv(calibration.CALIBRATION_VARIABLE, str(tmp_path / "calibration.json"))
    here = detect()
    assert here.throughput == {}  # none kept: the cpu profile's, said as unmeasured here
    figures = {**load_hardware("cpu").throughput, "half_work": 0.4, "source": "measured on this machine by a test"}
    path = calibration.save_figures(here.kind, here.chip, figures, [])
    assert detect().throughput == figures
    planned = throughput_for(detect().throughput, "cpu", "cpu")
    assert planned.half_work == 0.4 and planned.measured and planned.source == figures["source"]
    assert load_hardware("cpu").throughput["half_work"] != 0.4  # a named profile keeps its own
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "machine": "cpu: another processor, 64 cores"}))
    assert detect().throughput == {}


def test_a_damaged_calibration_is_named_with_its_fix(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    path.write_text('{"machine": "cpu: ')
    monkeypatch.setenv(calibration.CALIBRATION_VARIABLE, str(path))
    with pytest.raises(MpskitError, match="is not a calibration mpskit wrote"):
        detect()
    env = {calibration.CALIBRATION_VARIABLE: str(path)}
    result = run_mpskit("plan", "stage=sft", "model_preset=qwen2.5-0.5b", env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(f"remove {path}; `mpskit calibrate` writes it again")


def test_a_plan_from_figures_not_measured_here_names_the_command_that_measures_them():
    words = ["stage=sft", "model_preset=qwen2.5-0.5b", "cutoff_len=256"]
    hint = "`mpskit calibrate`, run on that machine, fits its figures to real steps"
    assert hint in run_mpskit("plan", *words).stdout  # this machine, no calibration kept (conftest)
    assert hint not in run_mpskit("plan", *words, "--hardware", "cpu").stdout  # measured on the profile's machine


def test_calibrate_without_the_real_model_says_how_to_fetch_it(tmp_path):
    result = run_mpskit("calibrate", env={"HOME": str(tmp_path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "fetch it once: mpskit get-model smollm2-135m" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / ".cache" / "mpskit" / "calibration.json").exists()


def test_steps_that_do_not_grow_with_their_work_fit_no_figures():
    profile = cpu_figures()
    flat = [replace(step, seconds=1.0) for step in steps_timed_as(profile)]  # every step the same second
    with pytest.raises(MpskitError, match="do not grow with their work"):
        fit_figures(flat, profile, "measured here")


def test_gpu_steps_that_are_mostly_kernel_launches_fit_no_rate():
    gpu = throughput_for({}, "cuda", "cuda")  # the default for an NVIDIA GPU
    # the real model's steps on an H200: a quarter of a second of launches whatever their tokens
    launched = [replace(step, seconds=step.seconds + 0.25) for step in steps_timed_as(gpu, device="cuda",
                                                                                       dtype="bf16")]  # fmt: skip
    with pytest.raises(MpskitError, match="mostly a fixed cost") as refused:
        fit_figures(launched, gpu, "measured here", "cuda")
    assert refused.value.fix == "time your own setting's steps: mpskit plan --probe"
    work_bound = steps_timed_as(replace(gpu, half_work=0.5, quantized_work=0.6, quantized_weight_s=1e-11),
                                device="cuda", dtype="bf16")  # fmt: skip
    assert fit_figures(work_bound, gpu, "measured here", "cuda").half_work == pytest.approx(0.5)


def test_a_plan_on_cuda_names_the_probe_and_not_calibrate():
    stdout = run_mpskit("plan", "stage=sft", "model_preset=qwen2.5-0.5b", "--hardware", "cuda-80gb").stdout
    assert "`mpskit calibrate`" not in stdout and "`mpskit plan --probe` times real steps" in stdout


@pytest.mark.e2e
@pytest.mark.real
@pytest.mark.slow
def test_calibrate_times_real_steps_and_plans_here_take_its_figures(tmp_path):
    assert (model_folder(PRESET) / "config.json").is_file(), f"the real model is missing: mpskit get-model {PRESET}"
    path = tmp_path / "calibration.json"
    env = {calibration.CALIBRATION_VARIABLE: str(path)}
    result = run_mpskit("calibrate", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"kept for this machine in {path}" in result.stdout
    record = json.loads(path.read_text())
    assert [row["case"] for row in record["steps"]] == [case.name for case in CASES]
    assert all(row["measured_s"] > 0 and row["fitted_s"] > 0 for row in record["steps"])
    assert record["throughput"]["half_work"] > 0 and record["throughput"]["quantized_work"] > 0
    words = ["stage=sft", f"model_preset={PRESET}", "dataset=identity", "cutoff_len=256", "quantization_bit=4"]
    plan = run_mpskit("plan", "--json", *words, env=env)
    duration = json.loads(plan.stdout)["duration"]
    assert duration["source"].startswith("measured on this machine by `mpskit calibrate`")
    assert duration["measured_figures"] and duration["predicted_step_s"] > 0


@pytest.mark.parametrize(
    ("figures", "said"),
    [({"half_work": 1e300}, "throughput.half_work=1e+300 is not a finite number above 0 and at most 100"),
     ({"flops_per_s": None}, "throughput.flops_per_s=None is not a finite number above 0 and at most 1e+17"),
     ({"stray": 1}, "throughput has unknown key(s) stray")],
    ids=["absurd", "missing", "unknown"],
)  # fmt: skip
def test_damaged_figures_of_this_machine_are_one_line_naming_the_file_in_plan_train_and_doctor(
    tmp_path, monkeypatch, figures, said
):
    """Figures kept for this very machine, but out of range or malformed: they used to end in a
    ZeroDivisionError or a line about "hardware profile this machine", while doctor said ready."""
    path = tmp_path / "calibration.json"
    monkeypatch.setenv(calibration.CALIBRATION_VARIABLE, str(path))
    here = detect()
    calibration.save_figures(here.kind, here.chip, {**load_hardware("cpu").throughput, **figures}, [])
    env = {calibration.CALIBRATION_VARIABLE: str(path)}
    for words in (["plan", "stage=sft", "model_preset=qwen2.5-0.5b"], ["train", "preset=sft"], ["doctor"]):
        result = run_mpskit(*words, env=env, cwd=tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and "Traceback" not in result.stderr, (words, result.stderr[-2000:])
        assert lines[-1] == f"mpskit: error: {path}: {said}; remove {path}, then run `mpskit calibrate` again " \
                            "(or plan without it)", words  # fmt: skip
