"""The table of training keys transformers 5 removed is derived from the code and covers them all."""

import dataclasses

import pytest
from conftest import ROOT

from mpskit.settings.removed_keys import (
    DROPPED,
    RENAMED,
    SWITCHED,
    TABLE_KEYS,
    TRANSFORMERS_4_FIELDS,
    translate_removed_keys,
)


def test_every_field_the_installed_transformers_removed_is_in_the_table():
    from transformers import TrainingArguments

    installed = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    removed = {name for name in TRANSFORMERS_4_FIELDS if name not in installed}
    assert removed == set(TABLE_KEYS)  # a new pin that removes more fails here
    assert all(new in installed for new in RENAMED.values())
    assert all(new in installed for new, _ in SWITCHED.values())


def test_every_removed_key_is_translated_or_dropped_with_a_warning(capsys):
    args = translate_removed_keys({key: True for key in TABLE_KEYS})
    assert not set(TABLE_KEYS) & set(args)
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == len(TABLE_KEYS) and all(line.startswith("mpskit: warning:") for line in warnings)
    assert args["train_sampling_strategy"] == "group_by_length" and args["use_cpu"] is True
    assert args["per_device_train_batch_size"] is True and args["include_for_metrics"] == ["inputs"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"group_by_length": False}, {}),
        ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"}),
        ({"per_gpu_train_batch_size": 4, "per_device_train_batch_size": 2}, {"per_device_train_batch_size": 2}),
        ({"overwrite_output_dir": True, "save_safetensors": True}, {}),
        ({"gradient_checkpointing": False}, {"disable_gradient_checkpointing": True}),
    ],
)
def test_translations(given, expected):
    assert translate_removed_keys(given) == expected


def test_the_usage_page_prints_the_table():
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    for key in TABLE_KEYS:
        assert f"`{key}`" in usage, key
    assert all(why in usage for why in DROPPED.values())


def test_a_seed_style_command_line_writes_its_config(tiny_model, tmp_path):
    from conftest import run_mpskit

    result = run_mpskit(
        "config", "preset=foodpo", f"model_name_or_path={tiny_model}", "template=qwen", f"dataset_dir={ROOT / 'data'}",
        "--group_by_length", "false", "--overwrite_output_dir", "true", "--per_gpu_train_batch_size", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "group_by_length" not in result.stdout and "overwrite_output_dir" not in result.stdout
    assert "per_device_train_batch_size: 2" in result.stdout
    assert result.stderr.count("was removed from transformers 5") == 2


@pytest.mark.e2e
def test_a_seed_style_command_line_trains(tiny_model, tmp_path):
    from conftest import run_mpskit

    old_switches = ["--group_by_length", "false", "--use_mps_device", "true", "--gradient_checkpointing", "true",
                    "--remove_unused_columns", "false", "--overwrite_output_dir", "true",
                    "--save_safetensors", "true"]  # fmt: skip
    result = run_mpskit(
        "train", "--stage", "foodpo", "--model_name_or_path", str(tiny_model), "--template", "qwen",
        "--dataset_dir", str(ROOT / "data"), "--dataset", "demo_pref", "--max_steps", "2", *old_switches,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for key in (
        "group_by_length",
        "use_mps_device",
        "gradient_checkpointing",
        "overwrite_output_dir",
        "save_safetensors",
    ):
        assert result.stderr.count(f"'{key}") == 1, key  # each translated key reported once
