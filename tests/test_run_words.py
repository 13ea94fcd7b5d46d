"""Run files and command-line words reach LLaMA-Factory as `llamafactory-cli train` would read them."""

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mpskit.cli import main
from mpskit.engine import lf
from mpskit.settings.run_words import read_run_words

# Each case: the words after `llamafactory-cli train` (a run file first, or none), and the file's text.
CASES = [
    (["--stage", "sft", "--do_train"], None),  # a bare flag
    (["--stage", "sft", "--do_train", "true", "--learning_rate", "1e-4"], None),
    (["--stage", "sft", "--learning_rate=5.0e-6", "--num_train_epochs", "3"], None),
    (["--stage", "dpo", "--pref_beta", "0.1", "--pref_loss", "sigmoid"], None),
    (["--stage", "sft", "--run_name", "123"], None),  # text by its argument class, not a number
    (["--stage", "sft", "--eval_strategy", "no", "--do_eval", "false"], None),  # `no` text, not a boolean
    (["--stage", "sft", "--lora_target", "q_proj,v_proj", "--bf16", "False"], None),
    (["--stage", "sft", "--report_to", "none", "--logging_steps", "5"], None),
    (["--stage", "sft", "--max_grad_norm", "1", "--warmup_ratio", ".1", "--lora_rank=16"], None),
    (["run.yaml"], "stage: sft\nlearning_rate: 1e-4\nnum_train_epochs: 3.0\nwarmup_ratio: 5.0e-2\n"),
    (["run.yaml", "learning_rate=5.0e-6", "do_eval=false"], "stage: sft\nlearning_rate: 1e-4\ndo_eval: true\n"),
    (["run.yml", "lora_rank=4"], "stage: sft\nlora_target: all\nreport_to: [tensorboard]\nmax_samples: 1_000\n"),
    (["run.yaml"], "stage: dpo\nrun_name: '007'\npref_beta: 1.0e-1\nplot_loss: True\n"),
    (["run.yaml", "run_name=7"], "stage: sft\n"),  # OmegaConf types a `key=value` word: 7 is a number
    (["run.json"], '{"stage": "sft", "learning_rate": 0.0002, "do_train": true, "lora_target": "all"}'),
    (["run.json", "lora_rank=4", "learning_rate=1e-5"], '{"stage": "dpo", "pref_beta": 0.2}'),
    (["run.yaml", "pref_loss=sigmoid"], "stage: dpo\nlogging_steps: 1\nsave_steps: 1e3\n"),
]


def llamafactory_values(words: list[str], monkeypatch) -> dict:
    """The values `llamafactory-cli train WORDS` hands its argument classes, through its own read_args."""
    from llamafactory.hparams.parser import _TRAIN_ARGS, read_args
    from transformers import HfArgumentParser

    # LLaMA-Factory 0.9.5 calls json.load on a Path (AttributeError); this reads the file it names,
    # while read_args runs (mpskit's own checks then read a tokenizer with the real json.load).
    with monkeypatch.context() as patched:
        patched.setattr(json, "load", lambda path: json.loads(Path(path).read_text()))
        patched.setattr(sys, "argv", ["llamafactory-cli", *words])
        values = read_args()
    if isinstance(values, dict):
        return values
    namespace, unknown = HfArgumentParser(_TRAIN_ARGS).parse_known_args(values)
    assert not unknown
    given = {word[2:].partition("=")[0] for word in values if word.startswith("--")}
    return {key: getattr(namespace, key) for key in given}


@pytest.mark.parametrize("words, text", CASES)
def test_mpskit_writes_what_llamafactory_cli_reads(words, text, tmp_path, monkeypatch, tiny_model):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        Path(words[0]).write_text(text)
    expected = llamafactory_values(words, monkeypatch)
    assert expected  # every case gives values

    model = ["model_preset=tiny", f"model_name_or_path={tiny_model}", "--hardware", "cpu", "eval_dataset="]
    if text is not None:  # a run file has no stage preset unless it asks: this one gives the demo data
        model.append(f"preset={expected['stage']}")
    assert main(["config", *words, *model, "-o", "written.yaml"]) == 0
    written = OmegaConf.to_container(OmegaConf.load("written.yaml"))  # how LLaMA-Factory reads the YAML
    assert {key: written[key] for key in expected} == expected
    assert all(type(written[key]) is type(value) for key, value in expected.items())


def test_bare_flags_and_both_word_styles_without_llamafactory():
    """`plan` reads words without importing LLaMA-Factory: numbers and true/false as it would type them."""
    words = ["--do_train", "lora_rank=4", "--learning_rate", "5e-3", "--eval_strategy=no", "--fp16", "stage=dpo"]
    assert read_run_words(words).values == {
        "do_train": True, "lora_rank": 4, "learning_rate": 0.005, "eval_strategy": "no", "fp16": True,
        "stage": "dpo",
    }  # fmt: skip


def test_plan_reads_keys_without_importing_llamafactory():
    assert lf.key_names() == lf.known_keys()


def test_templates_and_their_stop_words_are_read_without_importing_llamafactory():
    from llamafactory.data.template import TEMPLATES

    assert lf.templates_in_source() == {name: template.stop_words for name, template in TEMPLATES.items()}


def test_plain_fields_are_typed_as_hfargumentparser_types_them():
    """mpskit types a plainly str/int/float/bool field without importing LLaMA-Factory: each value it
    gives equals HfArgumentParser's, for every such key of the five argument classes."""
    from llamafactory.hparams.parser import _TRAIN_ARGS
    from transformers import HfArgumentParser

    parser = HfArgumentParser(_TRAIN_ARGS)
    kinds = {key: lf._plain_type(annotation) for key, annotation in lf.argument_annotations().items()}
    checked = 0
    for text in [None, "1", "0", "yes", "No", "T", "3.5", "1e-4", "123", "abc", "true", "-2", "1_000", " 7", "None"]:
        typed = {key: lf._typed_plainly(kind, text) for key, kind in kinds.items() if kind}
        typed = {key: value for key, value in typed.items() if value is not None}
        words = [word for key in typed for word in ([f"--{key}"] if text is None else [f"--{key}={text}"])]
        namespace, unknown = parser.parse_known_args(words)
        assert not unknown
        for key, value in typed.items():
            assert (getattr(namespace, key), type(getattr(namespace, key))) == (value, type(value)), (key, text)
        checked += len(typed)
    assert checked > 1500 and {"str", "int", "float", "bool", "bool or None"} <= set(kinds.values())


def test_an_empty_value_unsets_the_key_as_omegaconf_reads_it():
    """`eval_dataset=` means none. HfArgumentParser would keep "" (LLaMA-Factory then fails on dataset "")."""
    assert read_run_words(["eval_dataset="]).values == {"eval_dataset": None}
    assert lf.typed_words({"eval_dataset": "", "lora_rank": "4"}) == {"lora_rank": 4}


def test_a_preset_path_as_the_first_word_is_a_setting(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("args:\n  stage: sft\n")
    read = read_run_words([f"preset={preset}", "lora_rank=4"])
    assert read.run_file is None and read.values == {"preset": str(preset), "lora_rank": 4}
