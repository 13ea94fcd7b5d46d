"""All 82 of LLaMA-Factory 0.9.5's own example YAMLs (tests/data/llamafactory_examples, unchanged)
through `mpskit train`, only the model (with its template) and the data swapped on the command line:
each trains 2 steps, or is refused in one line; where mpskit refuses, plain `llamafactory-cli train`
does not train the file either (it fails, or it is a file for another command and trains nothing)."""

import json
import math
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_llamafactory_cli, run_mpskit

EXAMPLES = ROOT / "tests" / "data" / "llamafactory_examples"
FILES = sorted(str(path.relative_to(EXAMPLES)) for path in EXAMPLES.rglob("*.yaml"))
DATASET = {"sft": "demo_sft", "dpo": "demo_pref", "rm": "demo_pref", "kto": "demo_kto", "pt": "demo_sft"}
EVAL_DATASET = {"sft": "demo_sft_eval", "dpo": "demo_pref_eval", "rm": "demo_pref_eval", "kto": "demo_kto"}

# The refusals on this CPU machine, by file or folder (longest match wins): what the one line says.
DEEPSPEED = "deepspeed on the CPU shards over several processes"  # one process here; several would train
REFUSED = {
    "accelerate/": "an accelerate launch config",
    "ktransformers/accelerate/": "an accelerate launch config",
    "ktransformers/train_lora/": "pip install ktransformers",
    "inference/": "llamafactory-cli chat FILE",
    "merge_lora/": "llamafactory-cli export FILE",
    "v1/": "USE_V1=1 llamafactory-cli train FILE",
    "megatron/": "Megatron-Core parallelism",
    "train_full/": DEEPSPEED,
    "train_lora/qwen3_lora_sft_ds3.yaml": DEEPSPEED,
    "extras/asft/": DEEPSPEED,
    "extras/adam_mini/": "pip install adam-mini",
    "extras/apollo/": "pip install apollo-torch",
    "extras/badam/": "pip install badam",
    "extras/galore/": "pip install galore-torch",
    "extras/mod/": "pip install mixture-of-depth",
    "extras/fp8/": "pip install wandb",  # then: fp8 trains on Ada and Hopper GPUs
    "extras/nlg_eval/": "predicts and does not train",
    "extras/multi_tokens/": "no stage given",  # a token list another file points at
    "extras/llama_pro/": "do not divide by freeze_trainable_layers",  # the tiny model has 2 layers
}


def refusal(name: str) -> str | None:
    matches = [prefix for prefix in REFUSED if name.startswith(prefix)]
    return REFUSED[max(matches, key=len)] if matches else None


def swapped(name: str, model: Path, tmp_path: Path) -> list[str]:
    values = yaml.safe_load((EXAMPLES / name).read_text()) or {}
    stage = values.get("stage", "sft")
    words = [str(EXAMPLES / name), f"model_name_or_path={model}", "template=qwen"]
    if stage not in DATASET:
        return words
    if stage == "pt":  # pt packs texts into cutoff_len blocks: the demo texts are too short for 2048
        from mpskit.trials.measure import write_long_data

        return [*words, f"dataset_dir={write_long_data(tmp_path / 'long')}", "dataset=long_sft"]
    words += [f"dataset={DATASET[stage]}", f"dataset_dir={ROOT / 'data'}"]
    return words + ([f"eval_dataset={EVAL_DATASET[stage]}"] if "eval_dataset" in values else [])


def test_every_example_is_here_and_the_table_names_only_them():
    assert len(FILES) == 82
    assert all(any(name.startswith(prefix) for name in FILES) for prefix in REFUSED)


@pytest.mark.e2e
@pytest.mark.parametrize("name", FILES)
def test_each_example_trains_two_steps_or_is_refused_in_one_line(name, tiny_model, tmp_path):
    words = [*swapped(name, tiny_model, tmp_path), "max_steps=2"]
    result = run_mpskit("train", *words, cwd=tmp_path)
    said = refusal(name)
    if said is None:
        assert result.returncode == 0, result.stderr[-3000:]
        record = next(tmp_path.rglob("mpskit.json"))
        assert json.loads(record.read_text())["attempts"][-1]["outcome"] == "finished"
        assert json.loads((record.parent / "trainer_state.json").read_text())["global_step"] == 2
        assert math.isfinite(json.loads((record.parent / "all_results.json").read_text())["train_loss"])
        return
    lines = [line for line in result.stderr.splitlines() if line.startswith("mpskit: error")]
    assert result.returncode == 2 and len(lines) == 1 and said in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not list(tmp_path.rglob("mpskit.json"))
    plain = run_llamafactory_cli("train", *words, cwd=tmp_path)
    assert plain.returncode != 0 or not list(tmp_path.rglob("trainer_state.json")), plain.stderr[-2000:]
