from pathlib import Path

import pytest
from conftest import ROOT

from mpskit.errors import MpskitError
from mpskit.presets import merge
from mpskit.settings.resolve import resolve
from mpskit.settings.run_words import read_run_words


def parse_overrides(words: list[str]) -> dict:
    return read_run_words(words).values


def test_overrides_accept_both_command_line_styles():
    words = [
        "--stage",
        "dpo",
        "--pref_beta",
        "0.1",
        "lora_rank=4",
        "--fp16=false",
        "learning_rate=5e-3",
        "eval_strategy=no",
    ]
    assert parse_overrides(words) == {
        "stage": "dpo",
        "pref_beta": 0.1,
        "lora_rank": 4,
        "fp16": False,
        "learning_rate": 0.005,
        "eval_strategy": "no",
    }


def test_a_bare_option_is_a_true_flag_as_in_llamafactory_cli():
    assert parse_overrides(["--do_train", "--lora_rank", "4"]) == {"do_train": True, "lora_rank": 4}
    with pytest.raises(MpskitError, match="lora_rank.*not a whole number"):
        resolve({"stage": "sft", "model_preset": "tiny", **parse_overrides(["--lora_rank"])}, hardware="cpu")


def test_later_layers_win():
    assert merge({"a": 1, "b": 1}, {"b": 2}, {"c": 3}) == {"a": 1, "b": 2, "c": 3}


def test_user_values_win_over_every_preset():
    run = resolve({"stage": "sft", "model_preset": "tiny", "lora_rank": 2, "cutoff_len": 64}, hardware="m1-8gb")
    assert run.args["lora_rank"] == 2 and run.args["cutoff_len"] == 64
    assert run.args["template"] == "qwen"  # from the model preset
    assert run.args["stage"] == "sft"


def test_hardware_pinned_args_beat_presets_but_not_the_user(tmp_path):
    profile = tmp_path / "pinned.yaml"
    profile.write_text("kind: apple-silicon\nchip: Apple M1\nram_gb: 8\nargs: {cutoff_len: 256, lora_rank: 4}\n")
    run = resolve({"stage": "sft", "model_preset": "tiny", "lora_rank": 16}, hardware=str(profile))
    assert run.args["cutoff_len"] == 256 and run.args["lora_rank"] == 16


def test_intel_mac_runs_on_cpu_without_half_precision():
    run = resolve({"stage": "dpo", "model_preset": "qwen1.5-0.5b"}, hardware="intel-mac")
    assert run.device == "cpu" and run.hide_mps
    assert run.args["use_cpu"] is True and not run.args["fp16"] and not run.args["bf16"]


def test_m1_uses_fp32_and_no_loader_workers():
    args = resolve({"stage": "sft", "model_preset": "qwen1.5-0.5b"}, hardware="m1-pro-16gb").args
    assert args["dataloader_num_workers"] == 0 and args["dataloader_pin_memory"] is False
    assert args["fp16"] is False and args["bf16"] is False
    assert "use_cpu" not in args


def test_loader_workers_a_user_asks_for_become_0_on_mps(capsys):
    user = {"stage": "sft", "model_preset": "qwen1.5-0.5b", "dataloader_num_workers": 4}
    assert resolve(dict(user), hardware="m1-pro-16gb").args["dataloader_num_workers"] == 0
    assert "worker processes fail there" in capsys.readouterr().err
    assert resolve(dict(user), hardware="cpu").args["dataloader_num_workers"] == 4  # a device rule of MPS only


def test_yaml_reads_exponents_as_numbers_like_llamafactory(tmp_path):
    from mpskit.presets import load_yaml

    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1e-4\nwarmup_ratio: 5.0e-2\nname: '1e-4'\nsteps: 10\n")
    assert load_yaml(path) == {"learning_rate": 1e-4, "warmup_ratio": 0.05, "name": "1e-4", "steps": 10}


def test_m3_with_recent_torch_uses_bf16():
    args = resolve({"stage": "sft", "model_preset": "qwen2.5-0.5b"}, hardware="m3-max-64gb").args
    assert args["bf16"] is True and args["fp16"] is False


def test_forced_cpu_on_a_mac_hides_mps():
    run = resolve({"stage": "sft", "model_preset": "tiny", "device": "cpu"}, hardware="m1-pro-16gb")
    assert run.device == "cpu" and run.hide_mps and run.args["use_cpu"] is True
    assert "device" not in run.args


def test_seed_no_cuda_means_cpu():
    run = resolve({"stage": "sft", "model_preset": "tiny", "no_cuda": True}, hardware="m1-pro-16gb")
    assert run.device == "cpu" and "no_cuda" not in run.args


def test_fp16_on_cpu_runs_with_a_note(capsys):
    """LLaMA-Factory trains fp16 on the CPU (torch autocasts there); tests/test_user_configs.py trains it."""
    assert resolve({"stage": "sft", "model_preset": "tiny", "fp16": True}, hardware="cpu").args["fp16"] is True
    assert "fp16 on the CPU" in capsys.readouterr().err


def test_cuda_profiles_use_bf16():
    args = resolve({"stage": "sft", "model_preset": "qwen2.5-1.5b"}, hardware="cuda-80gb").args
    assert args["bf16"] is True and "use_cpu" not in args


def test_foodpo_preset_extends_dpo():
    dpo = resolve({"stage": "dpo", "model_preset": "tiny"}, hardware="cpu")
    foodpo = resolve({"stage": "foodpo", "model_preset": "tiny"}, hardware="cpu")
    stages = ROOT / "mpskit" / "configs" / "stages"
    assert foodpo.layers[:2] == [str(stages / "dpo.yaml"), str(stages / "foodpo.yaml")]
    own = {"stage": "foodpo", "pref_beta_scale": 0.05, "foodpo_ppl_source": "policy"}
    assert foodpo.args == {**dpo.args, **own}


def test_a_preset_that_extends_itself_is_refused(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"extends: {loop}\nargs: {{stage: sft}}\n")
    with pytest.raises(MpskitError, match="leads back to itself"):
        resolve({"preset": str(loop), "model_preset": "tiny"}, hardware="cpu")


def test_scripts_train_the_presets_own_model_unless_model_path_is_set(tmp_path):
    """MODEL_PRESET=qwen2.5-1.5b alone must not train another model planned with 1.5B's dimensions."""
    import os
    import subprocess
    import sys

    show = 'source scripts/train_knobs.sh; printf "%s\\n" "${TRAIN_ARGS[@]}"'
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    for model_path, expected in (("", None), ("/models/mine", "model_name_or_path=/models/mine")):
        env = {**os.environ, "PATH": path, "MODEL_PRESET": "qwen2.5-1.5b", "MODEL_PATH": model_path}
        done = subprocess.run(["bash", "-c", show], cwd=ROOT, capture_output=True, text=True, env=env)
        words = done.stdout.split()
        assert done.returncode == 0 and "model_preset=qwen2.5-1.5b" in words, done.stderr
        assert [w for w in words if w.startswith("model_name_or_path=")] == ([expected] if expected else [])
    env = {**os.environ, "PATH": path, "DATA": "~/rows.jsonl"}  # a file of its own: no dataset_dir beside it
    words = subprocess.run(["bash", "-c", show], cwd=ROOT, capture_output=True, text=True, env=env).stdout.split()
    assert "dataset=~/rows.jsonl" in words and not [w for w in words if w.startswith("dataset_dir=")]
    env = {**os.environ, "PATH": path, "MAX_SEQ_LEN": "64 lora_rank=2"}  # one knob stays one word
    done = subprocess.run(["bash", "-c", show], cwd=ROOT, capture_output=True, text=True, env=env)
    assert "cutoff_len=64 lora_rank=2" in done.stdout.splitlines() and "lora_rank=2" not in done.stdout.splitlines()


def test_a_users_own_dataset_is_never_evaluated_on_the_demo_set(capsys, tmp_path):
    own = resolve({"stage": "dpo", "model_preset": "tiny", "dataset": "mine", "dataset_dir": str(tmp_path)}, "cpu")
    assert "eval_dataset" not in own.args and own.args["eval_strategy"] == "no"
    assert "evaluation off: dataset=mine" in capsys.readouterr().err
    given = resolve({"stage": "dpo", "model_preset": "tiny", "dataset": "mine", "val_size": 0.1}, "cpu")
    assert "eval_dataset" not in given.args
    assert given.args["eval_strategy"] == "epoch" and given.args["val_size"] == 0.1
    demo = resolve({"stage": "dpo", "model_preset": "tiny"}, "cpu")  # the demo keeps its evaluation set
    assert demo.args["eval_dataset"] == "demo_pref_eval"


def test_pure_bf16_follows_the_bf16_device_rule(capsys):
    """LLaMA-Factory refuses pure_bf16 where torch has no bf16 accelerator; mpskit runs fp32 there, said."""
    user = {"stage": "sft", "model_preset": "tiny", "pure_bf16": True}
    assert resolve(dict(user), hardware="cpu").args["pure_bf16"] is False
    assert "pure_bf16 needs an accelerator" in capsys.readouterr().err
    assert resolve(dict(user), hardware="cuda-80gb").args["pure_bf16"] is True


def test_training_data_named_for_evaluation_too_is_warned_of(capsys, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"instruction": "q", "output": "a"}\n' * 4)
    same = ({"dataset": "demo_sft", "eval_dataset": "demo_sft"}, {"dataset": str(data), "eval_dataset": str(data)})
    for given in same:
        resolve({"preset": "sft", "model_preset": "tiny", **given}, hardware="cpu")
        assert "is both trained and evaluated on: the eval figures are not held out" in capsys.readouterr().err
    resolve({"preset": "sft", "model_preset": "tiny"}, hardware="cpu")  # the demo's own held-out set
    assert "both trained and evaluated" not in capsys.readouterr().err
