"""Budgets, the planner's search, and `mpskit plan` (no training: pure arithmetic on presets)."""

import json
import math
import random
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import ROOT, run_mpskit

from mpskit.machine.hardware import load_hardware
from mpskit.plan.advice import plan_run
from mpskit.plan.budget import SAFETY_MARGIN, budget_for
from mpskit.plan.memory import FRAMEWORK_BYTES, GB, LIBRARY_PAGES_BYTES, ModelDims, estimate
from mpskit.plan.planner import PlanRequest, plan
from mpskit.settings.resolve import resolve

QWEN15_05B = ModelDims(hidden=1024, layers=24, heads=16, kv_heads=16, ffn=2816, vocab=151936, model_type="qwen2")
STAGE_ARGS = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "cutoff_len": 512, "lora_rank": 8}


def test_mps_budget_is_the_smaller_of_the_cap_and_ram_minus_headroom():
    hw = load_hardware("m1-pro-16gb")  # cap 1.17 x 10.67 = 12.48 GB; 16 - 3.5 - framework
    expected = min(12.48 * GB, 12.5 * GB - FRAMEWORK_BYTES)
    assert budget_for(hw, "mps", FRAMEWORK_BYTES).training_bytes == pytest.approx(expected, rel=1e-3)
    big = load_hardware("m4-max-128gb")  # there the watermark cap is the smaller one
    cap = 1.7 * big.recommended_max_gb
    assert budget_for(big, "mps", FRAMEWORK_BYTES).training_bytes <= cap * GB


def test_cuda_and_cpu_budgets():
    assert budget_for(load_hardware("cuda-80gb"), "cuda", 0).training_bytes == pytest.approx(79 * GB, rel=1e-3)
    cpu = load_hardware("cpu")  # a named profile: its RAM, not this machine's
    expected = 21 * GB - FRAMEWORK_BYTES
    assert budget_for(cpu, "cpu", FRAMEWORK_BYTES).training_bytes == pytest.approx(expected, rel=1e-3)
    assert budget_for(cpu, "cpu", 0, override_gb=2.5).training_bytes == int(2.5 * GB)


@pytest.mark.parametrize("budget_gb", [1.5, 2.5, 4, 6, 9, 14])
@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_choice_fits_with_margin_and_keeps_the_effective_batch(stage, budget_gb):
    result = plan(PlanRequest(stage, STAGE_ARGS, load_hardware("cpu"), "cpu", QWEN15_05B, budget_gb=budget_gb))
    if result.fits:
        assert result.chosen.estimate.training <= budget_gb * GB * (1 - SAFETY_MARGIN)
        assert result.chosen.knobs.batch * (8 // result.chosen.knobs.batch) == 8
        assert result.chosen.knobs.cutoff_len >= 256
    else:
        assert "over the budget" in result.over_budget


def test_quality_knobs_move_only_when_nothing_else_fits():
    whole = {**STAGE_ARGS, "lean_logits": False}  # whole logits: 3.4 GB is too little for cutoff 512
    roomy = plan(PlanRequest("sft", whole, load_hardware("cpu"), "cpu", QWEN15_05B, budget_gb=14))
    assert (roomy.chosen.knobs.cutoff_len, roomy.chosen.knobs.lora_rank) == (512, 8)
    tight = plan(PlanRequest("sft", whole, load_hardware("cpu"), "cpu", QWEN15_05B, budget_gb=3.4))
    assert tight.fits and tight.chosen.knobs.cutoff_len < 512
    assert any("cutoff_len 512 ->" in note and "min_cutoff_len" in note for note in tight.changes)
    floored = plan(PlanRequest("sft", whole, load_hardware("cpu"), "cpu", QWEN15_05B, budget_gb=3.4, cutoff_floor=512))
    assert all(o.knobs.cutoff_len == 512 for o in [floored.asked, *floored.alternatives])
    assert floored.chosen is None or floored.chosen.knobs.cutoff_len == 512
    # lean logits: auto
    lean = plan(PlanRequest("sft", STAGE_ARGS, load_hardware("cpu"), "cpu", QWEN15_05B, budget_gb=3.4))
    assert lean.chosen.knobs.lean_logits and lean.chosen.knobs.cutoff_len == 512
    assert not any("cutoff_len" in note for note in lean.changes)


def test_more_memory_never_gives_a_slower_choice():
    speeds = []
    for budget_gb in (2, 3, 4, 6, 8, 12, 16, 32):
        result = plan(PlanRequest("dpo", STAGE_ARGS, load_hardware("cpu"), "cpu", QWEN15_05B, budget_gb=budget_gb))
        speeds.append((result.chosen.knobs.cutoff_len, result.chosen.speed) if result.fits else (0, 0))
    assert speeds == sorted(speeds)


def test_pinned_knobs_are_never_changed():
    rng = random.Random(0)
    for _ in range(20):
        budget_gb = rng.uniform(2, 20)
        args = {**STAGE_ARGS, "per_device_train_batch_size": 2, "disable_gradient_checkpointing": True}
        pinned = frozenset({"per_device_train_batch_size", "disable_gradient_checkpointing"})
        asked = PlanRequest("sft", args, load_hardware("cpu"), "cpu", QWEN15_05B, pinned=pinned, budget_gb=budget_gb)
        result = plan(asked)
        if result.fits:
            assert result.chosen.knobs.batch == 2 and not result.chosen.knobs.checkpointing


def test_resolve_separates_pinned_from_auto_knobs():
    run = resolve(
        {"stage": "sft", "model_preset": "qwen2.5-0.5b", "lora_rank": 16, "cutoff_len": "auto"}, hardware="cpu"
    )
    assert "lora_rank" in run.pinned and "cutoff_len" not in run.pinned
    assert run.args["cutoff_len"] == 512  # the stage preset's value: the planner's target
    assert plan_run(run).chosen.knobs.lora_rank == 16


def test_plan_prints_a_verdict_and_a_choice_for_qwen15_foodpo_on_16gb_m1_pro():
    result = run_mpskit("plan", "preset=foodpo", "model_preset=qwen1.5-0.5b", "--hardware", "m1-pro-16gb")
    assert result.returncode == 0, result.stderr
    assert "verdict    fits" in result.stdout
    assert "chosen     batch" in result.stdout
    assert "also fits" in result.stdout
    framework = (FRAMEWORK_BYTES + LIBRARY_PAGES_BYTES) / GB
    budget = f"{min(12.48, 16 - 3.5 - framework):.2f} GB"  # the MPS cap is 78% of 16 GB
    assert (
        f"budget     {budget} = min(MPS cap 12.48 GB, 16 GB RAM - 3.5 GB headroom - {framework:.2f} GB framework)"
        in result.stdout
    )


def test_memory_figures_carry_only_the_allocator_terms_measured_there():
    """glibc's heap terms on the Linux CPU alone; MPS and a macOS CPU plan with borrowed factors and say so."""
    words = ("plan", "stage=sft", "model_preset=qwen2.5-0.5b", "--hardware")
    linux, intel_mac, m1 = (run_mpskit(*words, name).stdout for name in ("cpu", "intel-mac", "m1-8gb"))
    assert "heap kept (glibc)" in linux and "unmeasured on" not in linux.split("duration")[0]
    assert "heap kept" not in intel_mac and "figures unmeasured on a CPU without glibc" in intel_mac
    assert "heap kept" not in m1 and "figures unmeasured on MPS" in m1


def test_plan_says_7b_on_8gb_m1_does_not_fit_and_what_would():
    result = run_mpskit("plan", "preset=sft", "model_preset=qwen2.5-7b", "--hardware", "m1-8gb")
    assert result.returncode == 3, result.stderr  # the report, and an exit code scripts can test
    assert "NO SETTING FITS" in result.stdout
    assert "GB over the budget" in result.stdout and "that the planner fills (85%" in result.stdout
    assert "model_preset=qwen2.5-3b" in result.stdout  # in 4 bits
    assert "--hardware m1-pro-16gb" in result.stdout


def test_the_machine_a_setting_needs_is_never_said_to_be_this_one():
    """About 8 GB on an 8 GB machine read as if this one would do; a budget given below the machine's
    own names no machine at all."""
    from dataclasses import replace

    from mpskit.plan.advice import what_would_fit

    run = resolve({"preset": "sft", "model_preset": "qwen2.5-7b", "cutoff_len": 4096}, hardware="m1-8gb")
    result = plan_run(run)
    setting = result.smallest.estimate.total / (1 - SAFETY_MARGIN) / GB
    headroom = math.floor(setting) + 1.3 - setting  # what the setting needs then ends in .3: "about N GB"
    needed = setting + headroom
    just_below = replace(run.hardware, ram_gb=round(needed), headroom_gb=headroom)  # a machine of N GB
    on = lambda hw: replace(result, request=replace(result.request, hw=hw, pinned=frozenset()))  # noqa: E731
    notes = what_would_fit(on(just_below))
    assert f"a machine with more RAM than this one's {just_below.ram_gb:g} GB (about {needed:.1f} GB)" in notes
    assert not any(note.startswith("a machine with about") for note in notes)
    roomy = replace(just_below, ram_gb=needed + 1)
    assert not any(note.startswith("a machine") for note in what_would_fit(on(roomy)))


@pytest.mark.parametrize(
    "stage, model, cutoff, hardware",
    [("foodpo", "qwen2.5-7b", 2048, "m1-pro-16gb"), ("sft", "qwen2.5-14b", 4096, "m2-max-32gb"),
     ("dpo", "qwen2.5-3b", 1024, "m1-8gb")],
)  # fmt: skip
def test_a_model_16_bits_cannot_fit_is_planned_in_4_bits_and_says_so(stage, model, cutoff, hardware):
    words = {"stage": stage, "model_preset": model, "cutoff_len": cutoff, "min_cutoff_len": cutoff}
    run = resolve(words, hardware=hardware)
    sixteen = plan_run(resolve({**words, "oom_ladder": "keep"}, hardware=hardware))
    assert not sixteen.fits  # oom_ladder=keep never quantizes; the no-fit answer names 4 bits
    assert any(note.startswith("quantization_bit=4 ") for note in sixteen.would_fit)
    result = plan_run(run)
    assert result.fits and result.chosen.knobs.quantization_bit == 4
    assert result.chosen.knobs.cutoff_len == cutoff
    assert "4-bit QLoRA (bitsandbytes): nothing fits with 16-bit weights" in result.changes


def test_a_plan_whose_peak_is_the_quantized_loading_says_so():
    from mpskit.plan.plan_report import plan_lines

    words = {"stage": "sft", "model_preset": "qwen2.5-7b", "cutoff_len": 16, "min_cutoff_len": 16,
             "quantization_bit": 4, "per_device_train_batch_size": 1}  # fmt: skip
    run = resolve(words, hardware="m1-pro-16gb")
    result = plan_run(run)
    shown = result.chosen.estimate
    assert result.fits and shown.training == shown.loading > shown.step
    assert any(line.startswith("  (loading, quantizing)") for line in plan_lines(run, result))


def test_4_bits_only_where_16_do_not_fit_and_bitsandbytes_builds():
    small = plan_run(resolve({"stage": "sft", "model_preset": "qwen2.5-0.5b"}, hardware="m1-pro-16gb"))
    assert small.fits and small.chosen.knobs.quantization_bit is None
    words = {"stage": "sft", "model_preset": "qwen2.5-7b", "cutoff_len": 512}
    assert plan_run(resolve(words, hardware="cpu")).chosen.knobs.quantization_bit == 4
    intel = plan_run(resolve(words, hardware="intel-mac"))  # no bitsandbytes wheel for Intel Macs
    assert not intel.fits and intel.smallest.knobs.quantization_bit is None
    assert not any("quantization_bit" in note for note in intel.would_fit)
    kept = plan_run(resolve({**words, "quantization_bit": 8}, hardware="cpu"))
    assert kept.asked.knobs.quantization_bit == 8 and (not kept.fits or kept.chosen.knobs.quantization_bit == 8)


def test_a_hub_model_is_planned_from_its_cached_config_and_offline_is_one_line(tmp_path, monkeypatch):
    from mpskit.errors import MpskitError
    from mpskit.plan.advice import model_dims

    snapshot = tmp_path / "models--Org--Model-7B" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--Org--Model-7B" / "refs").mkdir()
    (tmp_path / "models--Org--Model-7B" / "refs" / "main").write_text("abc")
    config = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
              "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}  # fmt: skip
    (snapshot / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dims = model_dims({}, "Org/Model-7B")
    assert (dims.hidden, dims.layers, dims.vocab, dims.tied_embeddings) == (3584, 28, 152064, False)
    with pytest.raises(MpskitError, match="Org/Other: its config.json is not cached and HF_HUB_OFFLINE is set"):
        model_dims({}, "Org/Other")
    result = run_mpskit("plan", "stage=sft", "dataset=demo_sft", "template=qwen", "model_name_or_path=Org/Other",
                        env={"HF_HUB_CACHE": str(tmp_path)})  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("mpskit: error: Org/Other: its config.json is not cached")


def test_plan_json_and_no_torch_import():
    code = (
        "import json, sys; from mpskit.cli import main; "
        "main(['plan', 'stage=dpo', 'model_preset=qwen2.5-1.5b', '--hardware', 'cuda-24gb', '--json']); "
        "assert 'torch' not in sys.modules, 'mpskit plan imported torch'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["fits"] and report["device"] == "cuda"
    assert report["chosen"]["estimate"]["training_gb"] <= report["budget_gb"]


def test_a_misspelt_key_in_train_is_answered_before_torch_loads(tiny_model):
    code = (
        "import sys; from mpskit.cli import main; "
        f"code = main(['train', 'preset=sft', 'model_name_or_path={tiny_model}', 'learning_rat=1e-4']); "
        "assert 'torch' not in sys.modules, 'mpskit train imported torch first'; sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    said = "mpskit: error: unknown key 'learning_rat'; did you mean 'learning_rate'?"
    assert done.stderr.strip().splitlines()[-1] == said


def test_training_refuses_a_run_no_setting_fits(tmp_path, tiny_model):
    result = run_mpskit(
        "train", "preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}",
        "memory_budget_gb=0.01", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "no setting fits" in result.stderr
    assert not (tmp_path / "output").exists()


def test_flash_attention_is_offered_only_where_the_profile_has_it():
    from dataclasses import replace

    from mpskit.plan.planner import candidates
    from mpskit.settings.knobs import Knobs

    asked = Knobs(batch=4, cutoff_len=512)
    without = load_hardware("cuda-24gb")
    assert not without.flash_attn
    attentions = {k.attention for k in candidates(asked, {"attention"}, without, "cuda", QWEN15_05B, 8, 256)}
    assert attentions == {"sdpa", "eager"}
    with_fa2 = replace(without, flash_attn=True)
    assert "fa2" in {k.attention for k in candidates(asked, {"attention"}, with_fa2, "cuda", QWEN15_05B, 8, 256)}


def test_a_local_models_own_config_wins_over_the_presets_dims(tmp_path):
    from mpskit.plan.advice import model_dims

    preset = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "ffn": 4864, "vocab": 151936}
    config = {"hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
              "intermediate_size": 11008, "vocab_size": 151936}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_dims(preset, str(tmp_path)).hidden == 2048  # the 3B model that will train
    assert model_dims(preset, "Qwen/Qwen2.5-0.5B").hidden == 896  # not downloaded: the preset says


def test_m1_keeps_fp32_where_an_fp32_setting_fits_and_takes_bf16_only_to_fit():
    """M1/M2 emulate bf16: it halves the memory but trains no faster and changes the numerics, so it
    is not a way to turn checkpointing off; where fp32 does not fit at the asked cutoff, it is."""
    fits = plan_run(resolve({"preset": "sft", "model_preset": "qwen2.5-0.5b"}, hardware="m1-8gb"))
    assert fits.chosen.knobs.dtype == "fp32" and fits.chosen.knobs.checkpointing
    assert any(option.knobs.dtype == "bf16" for option in fits.alternatives)  # faster, listed, not chosen
    tight = plan_run(resolve({"preset": "sft", "model_preset": "qwen2.5-0.5b", "cutoff_len": 4096}, hardware="m1-8gb"))
    assert tight.chosen.knobs.dtype == "bf16" and tight.chosen.knobs.cutoff_len == 4096
    assert tight.chosen.knobs.quantization_bit is None


@pytest.mark.parametrize("profile", ["m1-8gb", "m1-pro-16gb", "m2-max-32gb", "m3-max-64gb", "m4-max-128gb"])
@pytest.mark.parametrize("model, cutoff", [("qwen2.5-0.5b", 512), ("qwen2.5-0.5b", 4096), ("qwen2.5-1.5b", 2048)])
def test_the_dtype_rule_on_every_apple_profile(profile, model, cutoff):
    """bf16 where it is fast (M3 and newer); on M1/M2 only where no fp32 setting fits at the cutoff,
    rank and bits the plan keeps."""
    hw = load_hardware(profile)
    run = resolve({"preset": "sft", "model_preset": model, "cutoff_len": cutoff}, hardware=profile)
    chosen = plan_run(run).chosen.knobs
    if "M1" not in hw.chip and "M2" not in hw.chip:
        assert chosen.dtype == "bf16"
        return
    kept = {"cutoff_len": chosen.cutoff_len, "lora_rank": chosen.lora_rank, "quantization_bit": chosen.quantization_bit}
    dims = ModelDims(**run.model_dims)
    fp32 = plan(PlanRequest(run.stage, {**run.args, **kept}, hw, run.device, dims, frozenset({"bf16", *kept})))
    assert (chosen.dtype == "bf16") == (not fp32.fits), (chosen, fp32.chosen)


def test_each_setting_of_mpskits_own_has_one_default_and_the_readme_states_it():
    """mpskit's own knobs default in one place (knobs.OwnKnobs), fooDPO's in another (FooDPOConfig), its
    other settings in a third (RunSettings): a RunSpec and a run that give none have them, and the
    key table in docs/usage.md says each."""
    import dataclasses
    import re

    from mpskit.settings.foodpo import FIELDS, FooDPOConfig
    from mpskit.settings.knobs import OWN_KEYS, OwnKnobs, from_args, own_settings
    from mpskit.settings.run_settings import RunSettings
    from mpskit.settings.run_spec import RunSpec

    foodpo = {key: getattr(FooDPOConfig(), name) for key, name in FIELDS.items()}
    defaults = {**OWN_KEYS, **{f.name: f.default for f in dataclasses.fields(RunSettings)}, **foodpo}
    usage = (ROOT / "docs" / "usage.md").read_text()
    said = {key: re.search(rf"^\| `{key}` \| default (`[^`]+`|unset)", usage, re.M)[1] for key in defaults}
    words = {True: "`true`", False: "`false`", None: "unset"}

    def stated(value) -> str:
        return words[value] if value is None or isinstance(value, bool) else f"`{value}`"

    assert said == {key: stated(value) for key, value in defaults.items()}
    run = resolve({"stage": "sft", "model_preset": "qwen2.5-0.5b"}, hardware="cpu")
    assert run.settings == RunSettings() and own_settings(run.args) == OwnKnobs()
    assert RunSpec.of({}) == RunSpec() and RunSpec().lean == OwnKnobs() and RunSpec().foodpo is None
    assert RunSpec.of({"stage": "foodpo"}).foodpo == FooDPOConfig()
    knobs = from_args(run.args)
    assert (knobs.lean_logits, knobs.lean_attention) == (OWN_KEYS["lean_logits"], OWN_KEYS["lean_attention"])


def test_the_held_out_pass_is_planned_and_its_batch_lowered_until_it_fits():
    from mpskit.plan.plan_report import plan_lines

    words = {"stage": "foodpo", "model_preset": "qwen2.5-7b", "cutoff_len": 2048, "min_cutoff_len": 2048}
    run = resolve(words, hardware="m1-pro-16gb")
    result = plan_run(run)
    chosen = result.chosen
    assert result.fits and run.args["per_device_eval_batch_size"] == 8  # the stage preset's
    assert 1 <= chosen.knobs.eval_batch < 8 and chosen.estimate.eval_parts
    limit = result.budget.training_bytes * (1 - SAFETY_MARGIN)
    assert chosen.estimate.training == max(chosen.estimate.step, chosen.estimate.evaluation) <= limit
    twice = replace(chosen.knobs, eval_batch=chosen.knobs.eval_batch * 2)  # the next batch up would not fit
    assert estimate(result.dims, twice, "foodpo", "mps").evaluation > limit
    lines = plan_lines(run, result)
    assert f"evaluation (the peak of one held-out batch of {chosen.knobs.eval_batch}, no gradients)" in lines
    assert any(line.startswith("  = peak ") and line.endswith(f"({chosen.estimate.peak_moment})") for line in lines)
    assert f"evaluation batch 8 -> {chosen.knobs.eval_batch}: the held-out pass at 8 does not fit" in result.changes
    pinned = plan_run(resolve({**words, "per_device_eval_batch_size": 8, "quantize_embeddings": False},
                              hardware="m1-pro-16gb"))  # fmt: skip
    assert not pinned.fits  # a batch the user set is kept: the held-out pass at 8 fits in no setting (of 16-bit
    # embeddings: packed, it does)
    quiet = plan_run(resolve({**words, "eval_strategy": "no"}, hardware="m1-pro-16gb"))
    assert quiet.chosen.knobs.eval_batch is None and not quiet.chosen.estimate.eval_parts
