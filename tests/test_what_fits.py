"""The "what fits" table of docs/memory-and-planner.md is the planner's, not typed by hand."""

import sys

from conftest import ROOT

sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "scripts")]

import what_fits  # noqa: E402


def test_lean_logits_fit_dpo_at_2048_on_a_16_gb_mac():
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-0.5b", True, False) >= 2048
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-0.5b", False, False) < 2048
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-1.5b", True, False) >= 1024


def test_lean_attention_brings_the_macs_within_a_step_of_the_cpu():
    """SDPA's math path stopped every Mac at SFT 16384 and DPO 8192; lean attention lifts that limit."""
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-1.5b", True, False) < 4096
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-1.5b", True, None) >= 4096
    assert what_fits.largest_cutoff("m1-pro-16gb", "dpo", "qwen2.5-0.5b", True, None) >= 8192
    for stage in ("sft", "dpo"):
        cpu = what_fits.largest_cutoff("cpu", stage, "qwen2.5-0.5b", True, None)
        assert what_fits.largest_cutoff("m4-max-128gb", stage, "qwen2.5-0.5b", True, False) < cpu
        assert what_fits.largest_cutoff("m4-max-128gb", stage, "qwen2.5-0.5b", True, None) >= cpu
        assert what_fits.largest_cutoff("m1-pro-16gb", stage, "qwen2.5-0.5b", True, None) >= cpu // 2


def test_a_16_gb_mac_plans_foodpo_at_4096_for_qwen25_15b():
    from conftest import run_mpskit

    words = ["preset=foodpo", "model_preset=qwen2.5-1.5b", "cutoff_len=4096", "min_cutoff_len=4096"]
    result = run_mpskit("plan", *words, "--hardware", "m1-pro-16gb")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lean attention" in result.stdout and "cutoff_len 4096" in result.stdout
    assert "attention  lean attention: -" in result.stdout and "against SDPA's math path" in result.stdout
    refused = run_mpskit("plan", *words, "lean_attention=false", "quantize_embeddings=false",
                         "--hardware", "m1-pro-16gb")  # fmt: skip
    assert refused.returncode == 3 and "NO SETTING FITS" in refused.stdout
    packed = run_mpskit("plan", *words, "lean_attention=false", "--hardware", "m1-pro-16gb")  # packed embeddings fit
    assert packed.returncode == 0 and "4-bit embeddings and output layer" in packed.stdout
