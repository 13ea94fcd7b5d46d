"""A user's LLaMA-Factory run file means what it says: mpskit adds device rules and the planner's
choices, names each key it wrote, and never a stage preset's values unless the file asks for one."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_llamafactory_cli, run_mpskit

DATA = ROOT / "data"


def run_file(tmp_path: Path, tiny_model: Path, **extra) -> Path:
    """A DPO file as a user writes it: no warmup, its own split of the data, a learning rate of its own."""
    values = {
        "model_name_or_path": str(tiny_model), "stage": "dpo", "do_train": True, "dataset": "demo_pref",
        "dataset_dir": str(DATA), "template": "qwen", "val_size": 0.1, "warmup_steps": 0, "learning_rate": 1.0e-3,
        "per_device_train_batch_size": 2, "max_steps": 4, "logging_steps": 1, "cutoff_len": 128,
        "output_dir": "saves/mine", **extra,
    }  # fmt: skip
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def named_keys(stderr: str) -> set[str]:
    """The keys on mpskit's `beside your settings` line."""
    line = next(line for line in stderr.splitlines() if "beside your settings" in line)
    return set(re.findall(r"([a-z_0-9]+)(?:=| \S+ -> )", line.partition("): ")[2]))


def log_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_a_run_file_trains_as_llamafactory_cli_trains_it(tmp_path, tiny_model):
    path = run_file(tmp_path, tiny_model)
    given = yaml.safe_load(path.read_text())
    result = run_mpskit("train", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "saves" / "mine"
    written = yaml.safe_load((run_dir / "llamafactory.yaml").read_text())
    differ = {key for key in {**given, **written} if given.get(key) != written.get(key)}
    assert differ and differ <= named_keys(result.stderr)  # each key mpskit wrote is named on screen
    record = json.loads((run_dir / "mpskit.json").read_text())
    assert set(record["changed_from_given"]) == differ
    # no preset values: no warmup (the first step runs at the full rate; a warmup starts at 0), no evaluation
    assert "warmup_ratio" not in written and "eval_dataset" not in written and "num_train_epochs" not in written
    rows = [row for row in log_rows(run_dir) if "loss" in row]
    assert rows[0]["lr"] == pytest.approx(given["learning_rate"])

    plain = run_llamafactory_cli("train", str(path), "output_dir=saves/plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    plain_rows = [row for row in log_rows(tmp_path / "saves" / "plain") if "loss" in row]
    assert len(rows) == len(plain_rows) == 4
    for ours, theirs in zip(rows, plain_rows, strict=True):
        assert math.isfinite(ours["loss"]) and ours["loss"] == pytest.approx(theirs["loss"], abs=1e-4)
        assert ours["lr"] == pytest.approx(theirs["lr"])


def test_words_that_name_a_stage_alone_get_no_preset_values(tmp_path, tiny_model):
    words = ["stage=sft", f"model_name_or_path={tiny_model}", "dataset=demo_sft", f"dataset_dir={DATA}"]
    result = run_mpskit("config", *words, "template=qwen", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(result.stdout)
    assert written["do_train"] is True  # `mpskit train stage=...` trains: said on screen
    assert "do_train" in named_keys(result.stderr)
    for key in ("learning_rate", "num_train_epochs", "warmup_steps", "eval_dataset", "eval_strategy", "seed"):
        assert key not in written, key


def test_what_words_without_a_preset_leave_unchosen_is_said(tmp_path, tiny_model):
    """stage=foodpo without pref_beta_scale trains exactly DPO; `KEY=auto` for a stage no plan covers
    leaves LLaMA-Factory's default (flash_attn keeps its own `auto`): each said on one line."""
    words = [f"model_name_or_path={tiny_model}", f"dataset_dir={DATA}", "template=qwen"]
    foodpo = run_mpskit("config", "stage=foodpo", "dataset=demo_pref", *words, cwd=tmp_path)
    assert foodpo.returncode == 0 and "stage foodpo without pref_beta_scale" in foodpo.stderr, foodpo.stderr
    scaled = run_mpskit("config", "stage=foodpo", "dataset=demo_pref", "pref_beta_scale=0.1", *words, cwd=tmp_path)
    assert scaled.returncode == 0 and "without pref_beta_scale" not in scaled.stderr
    kto = run_mpskit("config", "stage=kto", "dataset=demo_kto", "flash_attn=auto", "lora_rank=auto", *words,
                     cwd=tmp_path)  # fmt: skip
    assert kto.returncode == 0 and "flash_attn=auto, lora_rank=auto: no plan chooses them here" in kto.stderr
    assert yaml.safe_load(kto.stdout)["flash_attn"] == "auto" and "lora_rank" not in yaml.safe_load(kto.stdout)


def test_own_data_without_a_stage_brings_its_stages_preset_said_on_one_line(tmp_path, tiny_model):
    rows = json.loads((DATA / "demo_pref.json").read_text())[:8]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run_mpskit("config", f"model_name_or_path={tiny_model}", "dataset=pairs.jsonl", "template=qwen",
                        cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0 and "the dpo preset sets what you did not (dpo.yaml" in result.stderr
    written = yaml.safe_load(result.stdout)
    assert written["stage"] == "dpo" and written["logging_steps"] == 5 and written["learning_rate"] == 5.0e-6
    assert written["eval_strategy"] == "no"  # the preset's eval_dataset belongs to its demo data


def test_an_optimizer_step_larger_than_the_training_set_is_said(tmp_path, tiny_model):
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={DATA}", "template=qwen",
             "per_device_train_batch_size=4"]  # fmt: skip
    result = run_mpskit("config", *words, "gradient_accumulation_steps=100", cwd=tmp_path)
    assert result.returncode == 0 and "takes 400 rows" in result.stderr and "holds 264" in result.stderr
    assert "whole epoch" not in run_mpskit("config", *words, "gradient_accumulation_steps=2", cwd=tmp_path).stderr


def test_config_o_names_the_settings_of_mpskits_own_that_the_yaml_cannot_hold(tmp_path, tiny_model):
    own = {"oom_ladder": "adapt", "min_cutoff_len": 128, "keep_awake": False, "lean_logits": False}
    values = {"preset": "sft", "model_name_or_path": str(tiny_model), "template": "qwen", **own}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(values))
    result = run_mpskit("config", "mine.yaml", "-o", "out.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "mpskit's own keys, not in out.yaml" in line]
    assert all(f"{key}={str(value).lower()}" in line.split("give them again")[1] for key, value in own.items())
    assert not set(own) & set(yaml.safe_load((tmp_path / "out.yaml").read_text()))


def test_a_preset_is_a_layer_where_the_file_asks_for_it(tmp_path, tiny_model):
    values = {"preset": "dpo", "model_name_or_path": str(tiny_model), "template": "qwen", "warmup_ratio": 0.1,
              "val_size": 0.2}  # fmt: skip
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(values))
    result = run_mpskit("config", "mine.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(result.stdout)
    assert written["learning_rate"] == 5.0e-6 and written["dataset"] == "demo_pref"  # the preset's
    # the user's key wins over its partner: never both warmup keys, never eval_dataset beside val_size
    assert written["warmup_ratio"] == 0.1 and "warmup_steps" not in written
    assert written["val_size"] == 0.2 and "eval_dataset" not in written
    assert "beside your settings" not in result.stderr


@pytest.mark.parametrize(
    "extra, said",
    [
        ({"do_train": False, "do_predict": True}, "predicts and does not train"),
        ({"do_train": False, "do_eval": True}, "evaluates and does not train"),
        ({"do_train": False}, "nothing to train"),
        ({"do_train": False, "export_dir": "merged"}, "for exporting a model (export_dir) and does not train"),
    ],
)
def test_a_file_that_does_not_train_is_refused_by_train(tmp_path, tiny_model, extra, said):
    path = run_file(tmp_path, tiny_model, **extra)
    result = run_mpskit("train", str(path), cwd=tmp_path)
    assert result.returncode == 2 and said in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "saves").exists()


def test_warmup_steps_as_a_word_is_typed_as_llamafactory_types_it(tmp_path, tiny_model):
    result = run_mpskit("config", str(run_file(tmp_path, tiny_model)), "warmup_steps=5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["warmup_steps"] == 5
    words = ["preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", "--warmup_steps", "5"]
    typed = run_mpskit("config", *words, cwd=tmp_path)
    assert typed.returncode == 0, typed.stderr
    assert yaml.safe_load(typed.stdout)["warmup_steps"] == 5.0  # transformers 5 types it float


@pytest.mark.e2e
def test_fp16_on_the_cpu_trains(tmp_path, tiny_model):
    result = run_mpskit("train", str(run_file(tmp_path, tiny_model, fp16=True)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fp16 on the CPU" in result.stderr
    assert yaml.safe_load((tmp_path / "saves" / "mine" / "llamafactory.yaml").read_text())["fp16"] is True
    losses = [row["loss"] for row in log_rows(tmp_path / "saves" / "mine") if "loss" in row]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)


LLAMAFACTORY = Path(importlib.util.find_spec("llamafactory").origin).parent


def test_the_optional_package_table_names_what_llamafactory_imports():
    """Each module of the table is one LLaMA-Factory checks for or imports under its key."""
    from mpskit.machine.optional_packages import FLAGS, GENERATION_METRICS

    source = "\n".join(path.read_text() for path in LLAMAFACTORY.rglob("*.py"))
    for modules, *_ in [*FLAGS.values(), *GENERATION_METRICS]:
        for module in modules:
            assert re.search(rf'(import {module}\b|from {module}[ .]|available\("{module}"\))', source), module


@pytest.mark.e2e
@pytest.mark.parametrize(
    "extra, package",
    [({"report_to": "wandb"}, "wandb"), ({"use_adam_mini": True}, "adam-mini"), ({"use_badam": True}, "badam")],
)
def test_a_missing_optional_package_is_one_line_before_the_run_and_fails_llamafactory_too(
    tmp_path, tiny_model, extra, package
):
    path = run_file(tmp_path, tiny_model, stage="sft", dataset="demo_sft", **extra)
    result = run_mpskit("train", str(path), cwd=tmp_path)
    assert result.returncode == 2 and f"pip install {package}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "saves").exists()
    plain = run_llamafactory_cli("train", str(path), cwd=tmp_path)
    assert plain.returncode != 0 and package.replace("-", "_") in plain.stderr.lower().replace("-", "_")
