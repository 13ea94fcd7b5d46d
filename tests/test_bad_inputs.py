"""Every bad input: exit code 2, one line naming the problem and the fix, no traceback, and nothing
that was there before is changed. Plus fuzzing of the config loader and merger (hypothesis)."""

import errno
import hashlib
import importlib.util
import json
import os
import platform
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_mpskit
from hypothesis import given, settings
from hypothesis import strategies as st

from mpskit.errors import MpskitError
from mpskit.plan.memory import GB
from mpskit.presets import load_yaml, merge
from mpskit.settings.resolve import PLANNER_KEYS, resolve
from mpskit.settings.run_words import read_run_words
from mpskit.settings.validate import CHOICES, RANGES, SWITCHES

DATA = ROOT / "data"


def make_files(work: Path, model: Path) -> dict[str, Path]:
    """Inputs the cases point at, written before the snapshot."""
    import torch
    from safetensors.torch import save_file

    files = {}

    def write(name: str, text: str | bytes) -> Path:
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        files[name] = path
        return path

    write("broken.yaml", "stage: sft\n  lora_rank: [4\n")
    write("list.yaml", "- stage\n- sft\n")
    write("broken.json", '{"stage": "sft",}')
    write("batch_fraction.yaml", "per_device_train_batch_size: 2.5\n")
    write("switch_text.json", '{"bf16": "maybe"}')
    write("list.json", '["stage", "sft"]')
    write("latin1.yaml", b"stage: sft\nrun_name: caf\xe9\n")
    (work / "folder.yaml").mkdir()
    write("hw_unknown_key.yaml", "kind: cpu\nchip: x\nram_gb: 8\ngpus: 2\n")
    write("hw_negative_ram.yaml", "kind: cpu\nchip: x\nram_gb: -8\n")
    write("no_config_model/weights.bin", "")
    write("model.Q4_1.gguf", b"GGUF")
    write("no_info/demo.json", "[]")
    write("bad_info/dataset_info.json", "{not json")
    write("missing_file/dataset_info.json", json.dumps({"d": {"file_name": "gone.json"}}))
    write("a_file", "not a folder")
    write("text.gguf", "not a GGUF file")
    write("compared/comparison.md", "last week's comparison")
    write("full_run/keep.txt", "two hours of training")
    write("no_ckpt_run/mpskit.json", "{}")
    write("no_ckpt_run/llamafactory.yaml", "stage: sft\n")
    write("typed_run/mpskit.json", '{"run_name": "r", "stage": "sft", "device": "cpu", "attempts": [{"attempt": "1"}]}')
    write("typed_run/llamafactory.yaml", "stage: sft\n")
    write("stopped_run/mpskit.json", json.dumps({"run_name": "r", "stage": "dpo", "device": "cpu",
                                                 "attempts": [{"attempt": 1, "outcome": "stopped by SIGINT"}]}))
    write("stopped_run/llamafactory.yaml", "stage: dpo\n")
    write("stopped_run/all_results.json", '{"train_runtime": 3.0}')  # LLaMA-Factory writes it at a stop too
    write("linked_run/mpskit.json", '{"run_name": "r", "stage": "sft", "device": "cpu"}')
    write("linked_run/llamafactory.yaml", "stage: sft\n")
    (work / "linked_run" / "trainer_log.jsonl").symlink_to(work / "elsewhere.jsonl")  # LLaMA-Factory appends there
    (work / "not_a_run").mkdir()
    ahead = work / "ahead" / "checkpoint-4"  # another run's complete checkpoint of step 4
    ahead.mkdir(parents=True)
    (ahead / "trainer_state.json").write_text('{"global_step": 4}')
    save_file({"weight": torch.ones(2)}, ahead / "adapter_model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt"):
        torch.save({}, ahead / name)
    (work / ".held.yaml.lock").mkdir()  # where config -o held.yaml would take its lock
    (work / ".linked.yaml.lock").symlink_to(work / "a_file")
    config = json.loads((model / "config.json").read_text())
    for name, value in (("zero_heads", {"num_attention_heads": 0}), ("list_heads", {"num_attention_heads": [2]}),
                        ("text_hidden", {"hidden_size": "64"})):  # fmt: skip
        write(f"{name}_model/config.json", json.dumps({**config, **value}))
    write("broken_demo/demo_sft.json", '[{"instruction": ')
    no_type = shutil.copytree(model, work / "no_type_model") / "config.json"
    no_type.write_text(json.dumps({k: v for k, v in json.loads(no_type.read_text()).items() if k != "model_type"}))
    cut = shutil.copytree(model, work / "cut_model") / "model.safetensors"  # a copy cut short
    cut.write_bytes(cut.read_bytes()[:-64])
    files["cut_model"] = cut.parent
    for name, facts in {
        "hw_nan_ram": "kind: cpu\nchip: x\nram_gb: .nan\n",
        "hw_headroom_text": "kind: cpu\nchip: x\nram_gb: 8\nheadroom_gb: lots\n",
        "hw_macos_float": "kind: apple-silicon\nchip: Apple M2\nram_gb: 16\nmacos: 14.5\n",
        "hw_gpu_count_text": "kind: cuda\nchip: x\nram_gb: 64\ngpu_count: two\n",
        "hw_negative_recommended": "kind: apple-silicon\nchip: Apple M1\nram_gb: 8\nrecommended_max_gb: -4\n",
        "hw_generation_zero": "kind: apple-silicon\nchip: Apple M1\nram_gb: 8\nchip_generation: 0\n",
        "hw_bf16_text": "kind: cuda\nchip: x\nram_gb: 64\ncuda_bf16: sometimes\n",
        "hw_no_kind": "chip: x\nram_gb: 8\n",
        "hw_kind_tpu": "kind: tpu\nchip: x\nram_gb: 8\n",
        "hw_args_list": "kind: cpu\nchip: x\nram_gb: 8\nargs: [1, 2]\n",
        "hw_infinite_gpu": "kind: cuda\nchip: x\nram_gb: 64\ngpu_memory_gb: .inf\n",
        "hw_throughput_no_source": "kind: cpu\nchip: x\nram_gb: 8\n"
        "throughput: {flops_per_s: 1.0e+11, step_overhead_s: 0.1}\n",
        "hw_throughput_zero": "kind: cpu\nchip: x\nram_gb: 8\n"
        "throughput: {flops_per_s: 0, step_overhead_s: 0.1, source: guess}\n",
        "hw_throughput_typo": "kind: cpu\nchip: x\nram_gb: 8\n"
        "throughput: {flops_per_s: 1.0e+11, step_overhead_s: 0.1, source: guess, measurd: true}\n",
    }.items():
        write(f"{name}.yaml", facts)
    model_args = f"args:\n  model_name_or_path: {model}\n  template: qwen\n"
    write("model_dims_text.yaml", model_args + "dims: lots\n")
    write(
        "model_dims_zero.yaml", model_args + "dims: {hidden: 0, layers: 2, heads: 2, kv_heads: 1, ffn: 8, vocab: 9}\n"
    )
    write("model_dims_quoted.yaml", model_args + "dims: {hidden: '64', layers: 2, heads: 2, kv_heads: 1, ffn: 8}\n")
    write("stage_a.yaml", f"extends: {work}/stage_b.yaml\nargs: {{stage: sft}}\n")
    write("stage_b.yaml", f"extends: {work}/stage_a.yaml\nargs: {{stage: sft}}\n")
    laughs = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    laughs += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefg", "bcdefgh", strict=True)]
    write("bomb.yaml", "\n".join(laughs) + "\nstage: sft\n")
    write("cycle.yaml", "stage: sft\nloop: &loop [*loop]\n")
    write("huge.yaml", "stage: sft\n" + "# padding\n" * 120_000)
    write("twice.yaml", "stage: sft\nlearning_rate: 1e-4\nlearning_rate: 2e-4\n")
    write("twice.json", '{"stage": "sft", "lora_rank": 4, "lora_rank": 8}')
    write("deep.yaml", "stage: sft\nx: " + "[" * 100_000 + "]" * 100_000 + "\n")
    write("deep.json", '{"stage": "sft", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    write("python_tag.yaml", "stage: !!python/object/apply:os.system ['echo hi']\n")
    lf_file = f"stage: sft\nmodel_name_or_path: {model}\ndataset: demo_sft\ndataset_dir: {DATA}\ntemplate: qwen\n"
    write("predict.yaml", lf_file + "do_predict: true\npredict_with_generate: false\n")
    write("idle.yaml", lf_file)
    write("rows.jsonl", '{"instruction": "1+1?", "output": "2"}\n')
    write("qmethod.yaml", "stage: sft\nquantization_bit: 4\nquantization_method: bitsandbytes\n")
    write("empty_list.jsonl", "[]\n")
    write("odd_entries/pairs.json", '[{"instruction": "a", "input": "", "chosen": "b", "rejected": "c"}]')
    write("odd_entries/notes.md", "not data")
    (work / "odd_entries" / "nothing").mkdir()
    write("odd_entries/dataset_info.json", json.dumps({"no_columns": {"file_name": "pairs.json", "ranking": True,
                                                                      "columns": {}},
                                                       "empty_folder": {"file_name": "nothing"},
                                                       "markdown": {"file_name": "notes.md"}}))  # fmt: skip
    write("stage_preset_conflict.yaml", f"stage: dpo\npreset: sft\nmodel_name_or_path: {model}\ntemplate: qwen\n")
    for name in ("record_folder_run", "record_fifo_run"):  # mpskit.json a folder, a FIFO
        write(f"{name}/llamafactory.yaml", "stage: sft\n")
    (work / "record_folder_run" / "mpskit.json").mkdir()
    os.mkfifo(work / "record_fifo_run" / "mpskit.json")
    write("list_config_model/config.json", "[1, 2]")
    write("null_pairs.jsonl", '{"instruction": "a", "chosen": null, "rejected": "c"}\n' * 2)
    write("number_pairs.jsonl", '{"instruction": "a", "chosen": 5, "rejected": 7}\n' * 2)
    write("deep_info/dataset_info.json", '{"d": ' + "[" * 100_000 + "]" * 100_000 + "}")
    write("bnb_model/config.json", json.dumps({"model_type": "qwen2", "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True}}))  # fmt: skip
    write("mixed_shapes.jsonl", '{"instruction": "a", "output": "b"}\n' * 2
          + '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n' * 2)
    write("my_preset.yaml", (ROOT / "mpskit" / "configs" / "stages" / "sft.yaml").read_text())  # a copied preset
    (work / "fifo_split").mkdir()
    os.mkfifo(work / "fifo_split" / "train.jsonl")
    os.mkfifo(work / "pipe.yaml")
    write("bad_config_model/config.json", "{ not json")
    write("config_only_model/config.json", '{"model_type": "qwen2"}')
    write("no_tokenizer_model/config.json", '{"model_type": "qwen2"}')
    write("no_tokenizer_model/model.safetensors", "")
    for path in model.iterdir():  # the tiny model as if saved GPTQ-quantized
        write(f"gptq_model/{path.name}", path.read_bytes())
    config = json.loads((model / "config.json").read_text())
    write("gptq_model/config.json", json.dumps({**config, "quantization_config": {"quant_method": "gptq", "bits": 4}}))
    (work / "dangling").symlink_to(work / "nowhere")
    (work / "loop").symlink_to("loop")  # a link to itself
    (work / "link_to_file").symlink_to("a_file")
    os.mkfifo(work / "fifo")
    write("fifo_data/dataset_info.json", json.dumps({"piped": {"file_name": "pipe.json"}}))
    os.mkfifo(work / "fifo_data" / "pipe.json")
    rows = {
        "broken.json": "[{\"instruction\": \"a\",",
        "empty.json": "",
        "latin1.json": b'[{"instruction": "caf\xe9", "output": "x"}]',
        "no_rejected.json": json.dumps([{"instruction": "q", "chosen": "a", "rejected": "b"},
                                        {"instruction": "q", "chosen": "a"}]),
        "strings.json": json.dumps(["a", "b"]),
        "mapping.json": json.dumps({"instruction": "q", "output": "a"}),
        "none.json": "[]",
        "no_output.json": json.dumps([{"instruction": "q"}]),
        "lines.jsonl": '{"instruction": "q", "output": "a"}\n{"instruction": \n',
        "number_prompt.json": json.dumps([{"instruction": 5, "input": "", "output": "a"}]),
        "number_answer.json": json.dumps([{"instruction": "q", "input": "", "output": 5}]),
        "no_input.json": json.dumps([{"instruction": "q", "output": "a"}]),
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "empty_answers.json": json.dumps([{"instruction": "q", "input": "", "output": " "}] * 2),
        "same_pairs.json": json.dumps([{"instruction": "q", "input": "", "chosen": "a", "rejected": "a"}] * 2),
        "answer_first.json": json.dumps([{"conversations": [{"from": "gpt", "value": "a"},
                                                            {"from": "human", "value": "q"}]}]),
    }  # fmt: skip
    for name, text in rows.items():
        write(f"ds/{name}", text)
    info = {Path(name).stem: {"file_name": name} for name in rows}
    info["no_rejected"].update(
        ranking=True, columns={"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}
    )
    info["answer_first"]["formatting"] = "sharegpt"
    info["same_pairs"].update(info["no_rejected"], file_name="same_pairs.json")
    info["not_a_mapping"] = "demo.json"
    write("ds/dataset_info.json", json.dumps(info))
    write("ds_list/dataset_info.json", "[]")
    return files


def base(model: Path) -> list[str]:
    return ["preset=sft", f"model_name_or_path={model}", f"dataset_dir={DATA}", "template=qwen"]


# (case id, words after `mpskit`, needles in the one error line); {w} is the work dir
# What a user writes: files, words, values, presets, hardware profiles, datasets, models.
INPUT_CASES = [
    ("run file missing", ["train", "{w}/nope.yaml"], ["does not exist"]),
    ("run file malformed", ["train", "{w}/broken.yaml"], ["not valid YAML", "line"]),
    ("run file is a list", ["train", "{w}/list.yaml"], ["not a mapping"]),
    ("run file not UTF-8", ["train", "{w}/latin1.yaml"], ["cannot read"]),
    ("run file is a folder", ["train", "{w}/folder.yaml"], ["cannot read"]),
    ("unknown key", ["train", "BASE", "lora_rnak=4"], ["unknown key 'lora_rnak'", "lora_rank"]),
    ("plan: unknown key", ["plan", "BASE", "lora_rnak=4"], ["unknown key 'lora_rnak'", "lora_rank"]),
    ("plan: unknown --key", ["plan", "BASE", "--learnig_rate", "1e-4"], ["unknown key 'learnig_rate'"]),
    ("bare flag for a number", ["config", "BASE", "--lora_rank"], ["--lora_rank", "expected one argument"]),
    ("word value of the wrong type", ["config", "BASE", "--num_train_epochs", "three"], ["invalid float value"]),
    ("JSON run file broken", ["train", "{w}/broken.json"], ["not valid JSON at line 1"]),
    ("run file: batch fractional", ["train", "{w}/batch_fraction.yaml", "BASE"], ["whole number"]),
    ("run file: switch text", ["train", "{w}/switch_text.json", "BASE"], ["bf16='maybe' is not true or false"]),
    ("JSON run file a list", ["plan", "{w}/list.json"], ["holds a list, not an object"]),
    ("no stage", ["train", "model_preset=tiny"], ["no stage given"]),
    ("unknown stage", ["train", "stage=ppo2", "model_preset=tiny"], ["unknown stage 'ppo2'"]),
    ("unknown model preset", ["train", "preset=sft", "model_preset=qwen9"], ["unknown models preset"]),
    ("unknown hardware", ["train", "BASE", "--hardware", "m9-ultra"], ["unknown hardware preset"]),
    ("hardware key unknown", ["train", "BASE", "--hardware", "{w}/hw_unknown_key.yaml"], ["unknown key(s) gpus"]),
    ("hardware RAM negative", ["train", "BASE", "--hardware", "{w}/hw_negative_ram.yaml"], ["ram_gb=-8"]),
    ("--hardware without value", ["train", "BASE", "--hardware"], ["--hardware needs a value"]),
    ("model missing", ["train", "preset=sft", "model_name_or_path={w}/nope"], ["MODEL_PATH", "make demo"]),
    ("model without config", ["train", "preset=sft", "model_name_or_path={w}/no_config_model"], ["config.json"]),
    ("model a GGUF file", ["train", "preset=sft", "model_name_or_path={w}/model.Q4_1.gguf"],
     ["is a GGUF file", "mpskit get-model", "model.Q4_1"]),  # fmt: skip
    ("get-model of no such preset", ["get-model", "qwen2.5-0.5b"], ["no model preset named 'qwen2.5-0.5b'",
                                                                   "smollm2-135m"]),
    ("get-model of a missing GGUF file", ["get-model", "{w}/nope.gguf"], ["nope.gguf not found"]),
    ("get-model of a folder", ["get-model", "{w}/not_a_run"], ["not_a_run is a folder, not a GGUF file"]),
    ("get-model of a FIFO", ["get-model", "{w}/fifo"], ["fifo is not a regular file (a FIFO or a device)"]),
    ("get-model of /dev/zero", ["get-model", "/dev/zero"], ["/dev/zero is not a regular file"]),
    ("get-model of a broken GGUF file", ["get-model", "{w}/model.Q4_1.gguf"], ["cannot convert", "whole GGUF file"]),
    ("hub id offline", ["train", "preset=sft", "model_preset=qwen2.5-0.5b"], ["Qwen/Qwen2.5-0.5B", "MODEL_PATH"]),
    ("dataset not listed", ["train", "BASE", "dataset=nope"], ["dataset 'nope'", "demo_sft"]),
    ("no dataset_info.json", ["train", "BASE", "dataset_dir={w}/no_info"], ["dataset_info.json not found"]),
    ("dataset_info.json broken", ["train", "BASE", "dataset_dir={w}/bad_info", "dataset=d"], ["not valid JSON"]),
    (
        "dataset file missing",
        ["train", "BASE", "dataset_dir={w}/missing_file", "dataset=d", "eval_dataset="],
        ["gone.json"],
    ),  # fmt: skip
    ("batch zero", ["train", "BASE", "per_device_train_batch_size=0"], ["per_device_train_batch_size=0"]),
    ("batch fractional", ["train", "BASE", "per_device_train_batch_size=2.5"], ["invalid int value: '2.5'"]),
    ("cutoff text", ["train", "BASE", "cutoff_len=long"], ["--cutoff_len", "invalid int value: 'long'"]),
    ("negative learning rate", ["train", "BASE", "learning_rate=-1e-4"], ["learning_rate"]),
    ("dropout above one", ["train", "BASE", "lora_dropout=1.5"], ["lora_dropout"]),
    ("switch not boolean", ["train", "BASE", "bf16=maybe"], ["--bf16", "Truthy value expected: got maybe"]),
    ("fp16 and bf16", ["train", "BASE", "fp16=true", "bf16=true"], ["both fp16 and bf16"]),
    ("attention unknown", ["train", "BASE", "flash_attn=turbo"], ["--flash_attn", "invalid choice: 'turbo'"]),
    ("auto on a non-knob", ["train", "BASE", "learning_rate=auto"], ["not a planner knob"]),
    ("device unknown", ["train", "BASE", "device=tpu"], ["device 'tpu'"]),
    ("device not on hardware", ["train", "BASE", "device=mps", "--hardware", "cpu"], ["hardware 'cpu' is cpu"]),
    ("budget zero", ["train", "BASE", "memory_budget_gb=0"], ["memory_budget_gb=0"]),
    ("impossible budget", ["train", "BASE", "memory_budget_gb=0.001"], ["no setting fits"]),
    ("cutoff floor negative", ["train", "BASE", "min_cutoff_len=-5"], ["min_cutoff_len=-5"]),
    (
        "fooDPO negative scale",
        ["train", "BASE", "preset=foodpo", "dataset=demo_pref", "eval_dataset=", "pref_beta_scale=-1"],
        ["pref_beta_scale"],
    ),  # fmt: skip
    (
        "fooDPO kto_pair",
        ["train", "BASE", "preset=foodpo", "dataset=demo_pref", "eval_dataset=", "pref_loss=kto_pair"],
        ["kto_pair"],
    ),  # fmt: skip
    ("resume: not a run", ["train", "--resume", "{w}/not_a_run"], ["not an mpskit run directory"]),
    ("resume with another key", ["train", "--resume", "{w}/not_a_run", "learning_rate=1"],
     ["--resume takes a run directory, and dataset=/eval_dataset="]),
    ("resume: nothing to resume", ["train", "--resume"], ["no run found"]),
    ("run_name climbs out", ["train", "BASE", "run_name=../x"], ["run_name '../x' would leave output/"]),
    ("run_name absolute", ["train", "BASE", "run_name=/tmp/x"], ["run_name '/tmp/x' would leave output/"]),
    ("run_name with a separator", ["train", "BASE", "run_name=a/b"], ["run_name 'a/b'"]),
    ("run_name hidden", ["config", "BASE", "run_name=.x"], ["run_name '.x'"]),
    ("learning rate infinite", ["train", "BASE", "learning_rate=inf"], ["learning_rate=inf", "finite"]),
    ("learning rate NaN", ["train", "BASE", "learning_rate=nan"], ["learning_rate=nan"]),
    ("epochs infinite", ["train", "BASE", "num_train_epochs=inf"], ["num_train_epochs=inf"]),
    ("budget NaN", ["plan", "BASE", "memory_budget_gb=nan"], ["memory_budget_gb=nan"]),
    ("budget infinite", ["train", "BASE", "memory_budget_gb=inf"], ["memory_budget_gb=inf"]),
    ("cutoff floor infinite", ["train", "BASE", "min_cutoff_len=inf"], ["min_cutoff_len=inf"]),
    (
        "fooDPO scale NaN",
        ["train", "BASE", "preset=foodpo", "dataset=demo_pref", "eval_dataset=", "pref_beta_scale=nan"],
        ["pref_beta_scale=nan"],
    ),  # fmt: skip
    (
        "fooDPO beta floor infinite",
        ["train", "BASE", "preset=foodpo", "dataset=demo_pref", "eval_dataset=", "foodpo_beta_min=inf"],
        ["foodpo_beta_min=inf"],
    ),  # fmt: skip
    (
        "fooDPO beta bounds swapped",
        [
            "train",
            "BASE",
            "preset=foodpo",
            "dataset=demo_pref",
            "eval_dataset=",
            "foodpo_beta_min=2",
            "foodpo_beta_max=1",
        ],
        ["foodpo_beta_min is above foodpo_beta_max"],
    ),  # fmt: skip
    (
        "fooDPO perplexity source unknown",
        ["train", "BASE", "preset=foodpo", "dataset=demo_pref", "eval_dataset=", "foodpo_ppl_source=oracle"],
        ["foodpo_ppl_source"],
    ),  # fmt: skip
    (
        "DPO beta zero",
        ["train", "BASE", "preset=dpo", "dataset=demo_pref", "eval_dataset=", "pref_beta=0"],
        ["pref_beta=0"],
    ),
    ("gradient clip negative", ["train", "BASE", "max_grad_norm=-1"], ["max_grad_norm=-1"]),
    ("warmup steps negative", ["train", "BASE", "warmup_steps=-3"], ["warmup_steps=-3"]),
    ("warmup ratio above one", ["train", "BASE", "warmup_ratio=2"], ["warmup_ratio=2"]),
    ("weight decay negative", ["train", "BASE", "weight_decay=-0.1"], ["weight_decay=-0.1"]),
    ("keep no checkpoints", ["train", "BASE", "save_total_limit=0"], ["save_total_limit=0"]),
    ("seed negative", ["train", "BASE", "seed=-1"], ["seed=-1"]),
    ("rank zero", ["train", "BASE", "lora_rank=0"], ["lora_rank=0"]),
    ("alpha fractional", ["train", "BASE", "lora_alpha=0.5"], ["--lora_alpha", "invalid int value: '0.5'"]),
    ("logging every 0 steps", ["train", "BASE", "logging_steps=0"], ["logging_steps=0"]),
    ("no samples", ["train", "BASE", "max_samples=0"], ["max_samples=0"]),
    ("cutoff below 8", ["train", "BASE", "cutoff_len=4"], ["cutoff_len=4"]),
    ("accumulation negative", ["train", "BASE", "gradient_accumulation_steps=-2"], ["gradient_accumulation_steps"]),
    ("batch boolean", ["train", "BASE", "per_device_train_batch_size=true"], ["invalid int value: 'true'"]),
    ("max_steps below -1", ["train", "BASE", "max_steps=-5"], ["max_steps=-5"]),
    ("lean logits maybe", ["train", "BASE", "lean_logits=maybe"], ["lean_logits='maybe'"]),
    ("lean attention maybe", ["train", "BASE", "lean_attention=maybe"], ["lean_attention='maybe'"]),
    ("lean attention a number", ["plan", "BASE", "lean_attention=2"], ["lean_attention=2"]),
    ("finetuning type unknown", ["train", "BASE", "finetuning_type=qlora"], ["invalid choice: 'qlora'"]),
    ("quantization to 3 bits", ["train", "BASE", "quantization_bit=3"], ["quantization_bit=3", "4 bits (NF4) or 8"]),
    ("quantization to 5 bits", ["plan", "BASE", "quantization_bit=5"], ["quantization_bit=5"]),
    ("quantized by HQQ", ["train", "BASE", "quantization_bit=4", "quantization_method=hqq"], ["hqq", "bitsandbytes"]),
    ("quantized full fine-tuning", ["train", "BASE", "quantization_bit=4", "finetuning_type=full"], ["adapters only"]),
    ("packed embeddings of a 16-bit base", ["train", "BASE", "quantize_embeddings=true"],
     ["quantize_embeddings=true", "quantization_bit=4"]),
    ("packed embeddings under LoRA", ["plan", "BASE", "quantization_bit=4", "quantize_embeddings=true",
                                      "lora_target=q_proj,lm_head"], ["lora_target names lm_head", "take lm_head out"]),
    ("packed embeddings resized", ["train", "BASE", "quantization_bit=4", "quantize_embeddings=true",
                                   "resize_vocab=true"], ["resize_vocab=true", "leave one of them out"]),
    ("packed embeddings, not a switch", ["plan", "BASE", "quantize_embeddings=yes"], ["quantize_embeddings='yes'"]),
    ("impossible cutoff (packed: every sequence fills it)",
     ["train", "BASE", "cutoff_len=100000000", "min_cutoff_len=100000000", "packing=true"], ["no setting fits"]),
    ("hardware RAM NaN", ["train", "BASE", "--hardware", "{w}/hw_nan_ram.yaml"], ["ram_gb=nan"]),
    ("hardware headroom text", ["plan", "BASE", "--hardware", "{w}/hw_headroom_text.yaml"], ["headroom_gb='lots'"]),
    ("hardware macOS a number", ["plan", "BASE", "--hardware", "{w}/hw_macos_float.yaml"], ["macos=14.5", "quote"]),
    ("hardware GPU count text", ["plan", "BASE", "--hardware", "{w}/hw_gpu_count_text.yaml"], ["gpu_count='two'"]),
    (
        "hardware negative working set",
        ["env", "--hardware", "{w}/hw_negative_recommended.yaml"],
        ["recommended_max_gb=-4"],
    ),  # fmt: skip
    ("hardware generation zero", ["detect", "--hardware", "{w}/hw_generation_zero.yaml"], ["chip_generation=0"]),
    ("hardware bf16 text", ["plan", "BASE", "--hardware", "{w}/hw_bf16_text.yaml"], ["cuda_bf16='sometimes'"]),
    ("hardware GPU memory infinite", ["plan", "BASE", "--hardware", "{w}/hw_infinite_gpu.yaml"], ["gpu_memory_gb=inf"]),
    ("hardware without kind", ["train", "BASE", "--hardware", "{w}/hw_no_kind.yaml"], ["lacks 'kind'"]),
    ("hardware kind unknown", ["train", "BASE", "--hardware", "{w}/hw_kind_tpu.yaml"], ["kind 'tpu'"]),
    ("hardware args a list", ["train", "BASE", "--hardware", "{w}/hw_args_list.yaml"], ["'args'"]),
    ("hardware file is a list", ["train", "BASE", "--hardware", "{w}/list.yaml"], ["not a mapping"]),
    ("demo model not built", ["train", "preset=sft", "model_preset=tiny"], ["not built yet", "mpskit tiny-model"]),
    ("throughput without source", ["plan", "BASE", "--hardware", "{w}/hw_throughput_no_source.yaml"], ["source"]),
    ("throughput zero", ["plan", "BASE", "--hardware", "{w}/hw_throughput_zero.yaml"], ["flops_per_s=0"]),
    ("throughput key typo", ["plan", "BASE", "--hardware", "{w}/hw_throughput_typo.yaml"], ["unknown key(s) measurd"]),
    ("probe another machine", ["plan", "BASE", "--probe", "--hardware", "m1-pro-16gb"], ["--probe times this machine"]),
    ("model dims text", ["plan", "preset=sft", "model_preset={w}/model_dims_text.yaml"], ["dims 'lots'"]),
    ("model dims zero", ["plan", "preset=sft", "model_preset={w}/model_dims_zero.yaml"], ["dims.hidden=0"]),
    ("model dims quoted", ["plan", "preset=sft", "model_preset={w}/model_dims_quoted.yaml"], ["dims.hidden='64'"]),
    ("stage preset extends itself", ["plan", "BASE", "preset={w}/stage_a.yaml"], ["leads back to itself"]),
    ("YAML alias bomb", ["train", "{w}/bomb.yaml"], ["nested aliases"]),
    ("YAML alias cycle", ["config", "{w}/cycle.yaml"], ["nested aliases"]),
    ("run file too large", ["train", "{w}/huge.yaml"], ["larger than"]),
    ("run file with a python tag", ["train", "{w}/python_tag.yaml"], ["not valid YAML"]),
    ("model config.json broken", ["train", "preset=sft", "model_name_or_path={w}/bad_config_model"], ["config.json"]),
    ("model config.json with no heads", ["plan", "BASE", "model_name_or_path={w}/zero_heads_model"],
     ["zero_heads_model/config.json", "num_attention_heads is 0", "fix that value"]),
    ("model config.json with heads in a list", ["plan", "BASE", "model_name_or_path={w}/list_heads_model"],
     ["num_attention_heads is [2]", "fix that value"]),
    ("model config.json with a quoted hidden size", ["plan", "BASE", "model_name_or_path={w}/text_hidden_model"],
     ['hidden_size is "64"', "fix that value"]),
    ("plan: val_size nan", ["plan", "BASE", "val_size=nan", "eval_dataset="], ["val_size=nan", "set val_size"]),
    ("plan: val_size text", ["plan", "BASE", "val_size=abc", "eval_dataset="], ["val_size=abc", "set val_size"]),
    ("tiny-model data of broken JSON", ["tiny-model", "{w}/made", "--data", "{w}/broken_demo"],
     ["broken_demo/demo_sft.json is not valid JSON", "fix the file"]),
    ("dataset nested too deep", ["train", "BASE", "dataset_dir={w}/ds", "dataset=deep", "eval_dataset="],
     ["ds/deep.json", "nests deeper", "fix the file"]),
    ("model is a file", ["train", "preset=sft", "model_name_or_path={w}/a_file"], ["no config.json"]),
    (
        "dataset JSON broken",
        ["train", "BASE", "dataset_dir={w}/ds", "dataset=broken", "eval_dataset="],
        ["broken.json", "line 1"],
    ),
    (
        "dataset file empty",
        ["train", "BASE", "dataset_dir={w}/ds", "dataset=empty", "eval_dataset="],
        ["empty.json is empty"],
    ),
    ("dataset not UTF-8", ["train", "BASE", "dataset_dir={w}/ds", "dataset=latin1", "eval_dataset="], ["not UTF-8"]),
    ("registered set whose every answer is empty",
     ["train", "BASE", "dataset_dir={w}/ds", "dataset=empty_answers", "eval_dataset="], ["every answer is empty"]),
    (
        "preference row without rejected",
        ["train", "BASE", "preset=dpo", "dataset_dir={w}/ds", "dataset=no_rejected", "eval_dataset="],
        ["no_rejected.json: row 2 has no 'rejected' column"],
    ),  # fmt: skip
    (
        "dataset rows are text",
        ["train", "BASE", "dataset_dir={w}/ds", "dataset=strings", "eval_dataset="],
        ["row 1 is a str"],
    ),
    (
        "dataset is one mapping",
        ["train", "BASE", "dataset_dir={w}/ds", "dataset=mapping", "eval_dataset="],
        ["not a list"],
    ),
    ("dataset has no rows", ["train", "BASE", "dataset_dir={w}/ds", "dataset=none", "eval_dataset="], ["no examples"]),
    (
        "SFT row without output",
        ["train", "BASE", "dataset_dir={w}/ds", "dataset=no_output", "eval_dataset="],
        ["row 1 has no 'output' column"],
    ),  # fmt: skip
    ("JSON Lines line broken", ["train", "BASE", "dataset_dir={w}/ds", "dataset=lines", "eval_dataset="], ["line 2"]),
    (
        "dataset entry not a mapping",
        ["train", "BASE", "dataset_dir={w}/ds", "dataset=not_a_mapping"],
        ["not a mapping"],
    ),
    ("dataset_info.json a list", ["train", "BASE", "dataset_dir={w}/ds_list"], ["not a mapping"]),
    ("eval set not listed", ["train", "BASE", "eval_dataset=nope"], ["dataset 'nope'"]),
    ("SFT on a preference set", ["train", "BASE", "dataset=demo_pref", "eval_dataset="], ["is a preference set"]),
    (
        "DPO on a plain set",
        ["train", "BASE", "preset=dpo", "dataset=demo_sft", "eval_dataset="],
        ["not a preference set"],
    ),
    ("resume: a file", ["train", "--resume", "{w}/a_file"], ["not an mpskit run directory"]),
    ("resume from a missing checkpoint", ["train", "BASE", "resume_from_checkpoint={w}/nope"], ["not a folder"]),
    ("resume from a checkpoint past max_steps", ["train", "BASE", "resume_from_checkpoint={w}/ahead/checkpoint-4",
     "max_steps=2"], ["is at step 4", "max_steps=2", "set max_steps above 4"]),
    ("stage ppo", ["train", "BASE", "stage=ppo"], ["stage ppo is not run by mpskit", "stage=rm"]),
    ("fsdp on the CPU", ["train", "BASE", "fsdp=full_shard"], ["fsdp (full_shard)", "accelerate would drop it"]),
    ("deepspeed on one CPU process", ["train", "BASE", "device=cpu", f"deepspeed={ROOT}/configs/deepspeed/ds_z2.json"],
     ["deepspeed on the CPU shards over several processes", "NPROC_PER_NODE=2"]),
    ("zero stage not shipped", ["config", "BASE", "zero=1"], ["zero=1 is not a ZeRO stage", "zero=2 or zero=3"]),
    ("zero beside deepspeed", ["config", "BASE", "zero=3", f"deepspeed={ROOT}/configs/deepspeed/ds_z2.json"],
     ["two DeepSpeed configs", "keep one of them"]),
    ("lean_logits under ZeRO-3", ["config", "BASE", "--hardware", "cuda-80gb", "lean_logits=true",
     f"deepspeed={ROOT}/configs/deepspeed/ds_z3.json"], ["which ZeRO-3 shards", "ZeRO-2 deepspeed config"]),
    ("lean_logits under FSDP", ["config", "BASE", "--hardware", "cuda-80gb", "lean_logits=true", "fsdp=full_shard"],
     ["which FSDP shards", "leave lean_logits out under FSDP"]),
    ("KTO on a set without kto_tag", ["train", "BASE", "preset=kto", "dataset=demo_sft"], ["no kto_tag column"]),
    ("word without a value", ["train", "BASE", "stage"], ["not key=value"]),
    ("word without a key", ["train", "BASE", "=4"], ["empty key"]),
    ("unknown command", ["trian"], ["invalid choice: 'trian'"]),
    ("compare without --out", ["compare", "{w}/not_a_run"], ["--out"]),
    ("compare of a run that stopped early", ["compare", "--out", "{w}/cmp", "{w}/stopped_run"],
     ["did not finish (stopped by SIGINT)", "finish it first: mpskit train --resume"]),
    ("template misspelt", ["train", "BASE", "template=qwne"], ["template 'qwne'", "did you mean 'qwen'"]),
    ("config: template misspelt", ["config", "BASE", "template=qwne"], ["template 'qwne'"]),
    ("val_size one", ["train", "BASE", "val_size=1", "eval_dataset="], ["val_size=1"]),
    ("val_size not a number", ["train", "BASE", "val_size=nan", "eval_dataset="], ["val_size=nan"]),
    ("val_size negative", ["train", "BASE", "val_size=-0.1", "eval_dataset="], ["val_size=-0.1"]),
    ("val_size holds out every row", ["train", "BASE", "val_size=100000", "eval_dataset="], ["leaving none"]),
    ("val_size beside eval_dataset", ["train", "BASE", "val_size=0.1", "eval_dataset=demo_sft_eval"],
     ["beside eval_dataset"]),
    ("dataset row: a number for text", ["train", "BASE", "dataset_dir={w}/ds", "dataset=number_prompt",
                                        "eval_dataset="], ["number_prompt.json", "cannot read row 1"]),
    ("dataset without alpaca's input column", ["train", "BASE", "dataset_dir={w}/ds", "dataset=no_input",
                                               "eval_dataset="], ["no_input.json has no 'input' column"]),
    ("dataset rows all dropped", ["train", "BASE", "dataset_dir={w}/ds", "dataset=number_answer", "eval_dataset="],
     ["would drop every row", "no answer"]),
    ("dataset rows: answer before question", ["train", "BASE", "dataset_dir={w}/ds", "dataset=answer_first",
                                              "eval_dataset="], ["would drop every row"]),
    # no silent nonsense
    ("run file gives a key twice", ["train", "{w}/twice.yaml", "BASE"], ["line 3", "learning_rate is given twice"]),
    ("JSON run file gives a key twice", ["train", "{w}/twice.json", "BASE"], ["gives the key lora_rank twice"]),
    ("YAML nested 100,000 deep", ["plan", "{w}/deep.yaml", "BASE"], ["nests values deeper"]),
    ("JSON nested 100,000 deep", ["plan", "{w}/deep.json", "BASE"], ["nests values deeper"]),
    ("every pair the same",
     ["train", "BASE", "preset=dpo", "dataset_dir={w}/ds", "dataset=same_pairs", "eval_dataset="],
     ["same_pairs.json", "chosen answer is its rejected one"]),
    ("max_steps zero", ["train", "BASE", "max_steps=0"], ["max_steps=0 trains nothing", "-1"]),
    ("fooDPO beta capped at zero", ["train", "BASE", "preset=foodpo", "dataset=demo_pref", "foodpo_beta_max=0"],
     ["foodpo_beta_max"]),
    # a run file means what it says
    ("a run file that predicts", ["train", "{w}/predict.yaml"], ["predicts and does not train", "llamafactory-cli"]),
    ("a run file that trains nothing", ["train", "{w}/idle.yaml"], ["nothing to train", "do_train: true"]),
    ("stage typo", ["train", "BASE", "stage=dop"], ["unknown stage 'dop'", "did you mean 'dpo'"]),
    ("a data folder whose train.jsonl is a FIFO", ["train", "preset=sft", "dataset={w}/fifo_split"],
     ["train.jsonl, which is not a regular file", "move train.jsonl away"]),
    ("a data file beside a dataset_dir", ["train", "BASE", "dataset={w}/rows.jsonl"],
     ["is a file, so dataset_dir", "leave out dataset_dir"]),
    ("quantization_method named as the library", ["train", "{w}/qmethod.yaml", "BASE"],
     ["not a LLaMA-Factory value", "quantization_method=bnb"]),
    ("oom_ladder not keep or adapt", ["train", "BASE", "oom_ladder=sometimes"], ["oom_ladder='sometimes'", "adapt"]),
    ("export of a folder that is not a run", ["export", "{w}/not_a_run", "-o", "{w}/merged"], ["not an mpskit run"]),
    ("export --gguf a K-quant", ["export", "{w}/not_a_run", "--gguf", "q4_k_m", "-o", "{w}/gguf"],
     ["K-quants are made by llama.cpp's own llama-quantize", "FILE.Q4_K_M.gguf Q4_K_M"]),
    ("export --gguf a type it does not write", ["export", "{w}/not_a_run", "--gguf", "int3", "-o", "{w}/gguf"],
     ["--gguf int3 is not a type", "q8_0"]),
    ("export --base without --gguf", ["export", "{w}/not_a_run", "--base", "-o", "{w}/merged"], ["add --gguf"]),
    ("chat a GGUF file that is not there", ["chat", "{w}/missing.gguf", "--prompt", "hi"], ["missing.gguf not found"]),
    ("chat a file that is no GGUF", ["chat", "{w}/text.gguf", "--prompt", "hi"], ["llama.cpp cannot load"]),
    ("chat a GGUF file with --base", ["chat", "{w}/text.gguf", "--base"], ["--base takes a run folder", "--gguf"]),
    ("chat at a negative temperature", ["chat", "{w}/text.gguf", "--temperature", "-1"], ["not a temperature"]),
    ("serve on port 70000", ["serve", "{w}/text.gguf", "--port", "70000"], ["not a port number"]),
    pytest.param(
        "MPS profile on a machine without MPS",
        ["train", "BASE", "--hardware", "m1-pro-16gb"],
        ["trains on MPS"],
        marks=pytest.mark.skipif(platform.system() == "Darwin" and platform.machine() == "arm64", reason="has MPS"),
    ),
    pytest.param(
        "CUDA profile on a machine without a GPU",
        ["train", "BASE", "--hardware", "cuda-24gb"],
        ["no NVIDIA GPU"],
        marks=pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="has nvidia-smi"),
    ),
    (
        "plan without dims",
        ["plan", "preset=sft", "model_name_or_path=some/model", "--hardware", "cpu"],
        ["some/model: its config.json is not cached and HF_HUB_OFFLINE is set", "use a model_preset"],
    ),  # fmt: skip
    ("plan: fooDPO's beta bounds crossed", ["plan", "BASE", "preset=foodpo", "foodpo_beta_min=2", "foodpo_beta_max=1"],
     ["foodpo_beta_min is above foodpo_beta_max", "swap them"]),
    ("export: mpskit.json a folder", ["export", "{w}/record_folder_run", "-o", "{w}/merged"],
     ["record_folder_run/mpskit.json is not a file", "--rebuild-record"]),
    ("resume: mpskit.json a FIFO", ["train", "--resume", "{w}/record_fifo_run"],
     ["record_fifo_run/mpskit.json is not a file", "move it away"]),
    ("a run file whose stage and preset disagree", ["plan", "{w}/stage_preset_conflict.yaml"],
     ["stage=dpo and preset=sft disagree: that preset trains stage sft", "give one of them"]),
    ("a ranking entry without columns", ["train", "BASE", "preset=dpo", "dataset_dir={w}/odd_entries",
                                         "dataset=no_columns", "eval_dataset="],
     ["pairs.json (alpaca, ranking) maps no column", '"chosen": "chosen"']),
    ("file_name at an empty folder", ["train", "BASE", "dataset_dir={w}/odd_entries", "dataset=empty_folder",
                                      "eval_dataset="], ["points at", "nothing, an empty folder"]),
    ("file_name at a file that is not data", ["train", "BASE", "dataset_dir={w}/odd_entries", "dataset=markdown",
                                              "eval_dataset="], ["notes.md, which LLaMA-Factory does not read"]),
    ("a data file of an empty list", ["plan", "preset=sft", "model_preset=tiny", "dataset={w}/empty_list.jsonl"],
     ["empty_list.jsonl holds no rows", "give it rows"]),
    ("a base saved quantized by bitsandbytes", ["train", "preset=sft", "model_name_or_path={w}/bnb_model"],
     ["says the model is saved quantized by bitsandbytes",
      "train its 16-bit original with quantization_bit=4 (quantized as it loads)"]),
    ("dataset_info.json nested deep", ["plan", "preset=sft", "model_preset=tiny", "dataset_dir={w}/deep_info",
                                       "dataset=d"], ["dataset_info.json nests values deeper than Python reads"]),
    ("eval of null answers", ["eval", "{w}/not_a_run", "--dataset", "{w}/null_pairs.jsonl"],
     ["null_pairs.jsonl: the first row's chosen is null, not text", "give every row's chosen as text"]),
    ("eval of number answers", ["eval", "{w}/not_a_run", "--dataset", "{w}/number_pairs.jsonl"],
     ["number_pairs.jsonl: the first row's chosen is a number, not text"]),
    ("a config.json that is a list", ["train", "preset=sft", "model_name_or_path={w}/list_config_model"],
     ["config.json holds a list, not an object", "restore the model's config.json"]),
    ("a data file whose rows change shape",
     ["plan", "preset=sft", "model_preset=tiny", "dataset={w}/mixed_shapes.jsonl"],
     ["change shape (rows 1-2: alpaca (instruction, output); rows 3-4: messages (sharegpt))", "split the file"]),
    ("a copied stage preset as the run file", ["plan", "{w}/my_preset.yaml", "model_preset=tiny"],
     ["my_preset.yaml is a preset (its settings sit under args:), not a run file", "name it as one: preset="]),
    ("eval_dataset a name beside a data file",
     ["plan", "preset=foodpo", "model_preset=tiny", "dataset={w}/rows.jsonl", "eval_dataset=demo_pref_eval"],
     ["eval_dataset=demo_pref_eval is a dataset name, and dataset=", "give eval_dataset a file too"]),
    ("plan: fooDPO's perplexity source unknown", ["plan", "BASE", "preset=foodpo", "foodpo_ppl_source=banana"],
     ["foodpo_ppl_source is 'banana'", "use policy or reference"]),
]

# Family 1, the engine: what LLaMA-Factory, transformers or peft would raise once the run began,
# checked before anything is written (the boundary's own cases are in test_errors.py).
ENGINE_CASES = [
    ("lora_target: no such module", ["train", "BASE", "lora_target=q_proj,nonexistent_proj"],
     ["has no module 'nonexistent_proj'", "q_proj", "lora_target=all"]),
    ("lora_target: a norm", ["train", "BASE", "lora_target=input_layernorm"], ["not a linear layer"]),
    ("train_on_prompt on DPO", ["train", "BASE", "preset=dpo", "dataset=demo_pref", "eval_dataset=",
                                "train_on_prompt=true"], ["train_on_prompt=true applies to SFT only"]),
    ("streaming with max_samples", ["train", "BASE", "streaming=true", "max_samples=10", "max_steps=2"],
     ["cannot take max_samples"]),
    ("streaming without max_steps", ["train", "BASE", "streaming=true"], ["needs max_steps"]),
    ("evaluation with nothing to evaluate on", ["train", "BASE", "eval_dataset=", "eval_strategy=epoch"],
     ["eval_strategy=epoch evaluates, but there is no eval_dataset", "eval_strategy=no"]),
    ("template of another family", ["config", "BASE", "template=llama3", "-o", "{w}/out.yaml"],
     ["<|eot_id|>", "another model family's template"]),
    ("model: config.json without model_type", ["train", "BASE", "model_name_or_path={w}/no_type_model"],
     ["names no model_type"]),
    ("model: a cut safetensors file", ["train", "BASE", "model_name_or_path={w}/cut_model"],
     ["not a readable safetensors file", "incomplete metadata"]),
    (
        "GPTQ base on the CPU",
        ["train", "preset=sft", "model_name_or_path={w}/gptq_model", "template=qwen", f"dataset_dir={DATA}"],
        ["GPTQ-quantized", "CUDA kernels", "quantization_bit=4"],
    ),  # fmt: skip
    # checked before the run folder exists (each used to crash after it, with `latest` moved to it)
    ("model folder with only config.json", ["train", "BASE", "model_name_or_path={w}/config_only_model"],
     ["has no weights"]),
    ("model folder without a tokenizer", ["train", "BASE", "model_name_or_path={w}/no_tokenizer_model"],
     ["has no tokenizer"]),
    pytest.param("report_to wandb without wandb", ["train", "BASE", "report_to=wandb"],
                 ["pip install wandb", "report_to: none"],
                 marks=pytest.mark.skipif(bool(importlib.util.find_spec("wandb")), reason="wandb is installed")),
    ("use_badam without badam", ["train", "BASE", "use_badam=true"], ["pip install badam"]),
    ("best model with strategies apart", ["train", "BASE", "load_best_model_at_end=true", "eval_strategy=epoch",
                                          "save_strategy=steps"], ["they are steps and epoch", "leave load_best"]),
    ("best model with saves unevaluated", ["train", "BASE", "load_best_model_at_end=true", "eval_strategy=steps",
                                           "eval_steps=3", "save_steps=4"], ["save_steps=4 is not a multiple of"]),
    ("report_to a list as a word", ["train", "BASE", "report_to=[wandb]"], ["a list written as one word"]),
    ("optim a number", ["train", "BASE", "optim=7"], ["--optim", "invalid choice: '7'"]),
]

# Family 2, records: a damaged or hand-edited mpskit.json, a run folder that is not what it was.
RECORD_CASES = [
    ("resume: unreadable record", ["train", "--resume", "{w}/no_ckpt_run"], ["is damaged: run_name is missing"]),
    ("resume: a link inside the run folder", ["train", "--resume", "{w}/linked_run"],
     ["trainer_log.jsonl is a link", "would write through it"]),
    ("resume: a record field of the wrong type", ["train", "--resume", "{w}/typed_run"],
     ['attempts[1].attempt is "1", not a whole number', "--rebuild-record"]),
    ("eval: a record field of the wrong type", ["eval", "{w}/typed_run"], ['attempts[1].attempt is "1"']),
    ("compare: a record field of the wrong type", ["compare", "--out", "{w}/cmp", "{w}/typed_run"],
     ['attempts[1].attempt is "1"']),
    (
        "resume from a cut checkpoint",
        ["train", "BASE", "resume_from_checkpoint={w}/not_a_run"],
        ["no readable trainer_state.json"],
    ),  # fmt: skip
    ("chat with a broken record", ["chat", "{w}/no_ckpt_run"], ["is damaged: run_name is missing"]),
]

# Family 3, the file system: names too long, links, devices, files where folders go, /proc, full
# folders. Family 4 (two commands at once on one output) is test_use_run.py's
# test_a_second_writer_of_one_output_is_one_line_naming_the_first.
FILE_SYSTEM_CASES = [
    ("output_dir holds files", ["train", "BASE", "output_dir={w}/full_run"], ["already holds files"]),
    ("output_dir under a file", ["train", "BASE", "output_dir={w}/a_file/run"], ["cannot create the run directory"]),
    ("config -o a name too long", ["config", "BASE", "-o", "{w}/" + "a" * 300 + ".yaml"],
     ["longer than its file system takes", "give -o a shorter name"]),
    ("config -o in /proc", ["config", "BASE", "-o", "/proc/run.yaml"], ["not on a disk", "give -o a path on a disk"]),
    ("compare --out a name too long", ["compare", "--out", "{w}/" + "a" * 300, "{w}/not_a_run"],
     ["longer than its file system takes", "give --out a shorter name"]),
    ("compare --out a file", ["compare", "--out", "{w}/a_file", "{w}/not_a_run"], ["is a file", "give --out a folder"]),
    ("tiny-model into a file", ["tiny-model", "{w}/a_file"], ["not an empty folder"]),
    ("tiny-model under a file", ["tiny-model", "{w}/a_file/model"], ["a part of it is a file, not a folder"]),
    ("export -o a name too long", ["export", "{w}/not_a_run", "-o", "{w}/" + "b" * 300],
     ["longer than its file system takes"]),
    ("run_name too long", ["train", "BASE", "run_name=" + "r" * 300], ["run_name is 300 characters long"]),
    ("run file a pipe", ["train", "{w}/pipe.yaml"], ["not a regular file"]),
    ("output_dir a dangling link", ["train", "BASE", "output_dir={w}/dangling"], ["link to nothing"]),
    ("output_dir is a file", ["train", "BASE", "output_dir={w}/a_file"], ["a_file"]),
    ("resume: a loop of links", ["train", "--resume", "{w}/loop"], ["cannot be followed to a folder"]),
    ("export: a loop of links", ["export", "{w}/loop", "-o", "{w}/merged"], ["cannot be followed to a folder"]),
    ("run inside the model folder", ["train", "BASE", "output_dir={w}/gptq_model/run"], ["inside the model folder"]),
    ("train: a FIFO in dataset_info", ["train", "BASE", "dataset_dir={w}/fifo_data", "dataset=piped"],
     ["points at", "not a regular file"]),
    ("config over an existing file", ["config", "BASE", "-o", "{w}/a_file"], ["a_file already exists", "--force"]),
    # a FIFO and a link stand in for /dev/null and /dev/stdout, which a failure here would replace
    ("config onto a FIFO", ["config", "BASE", "-o", "{w}/fifo", "--force"], ["fifo is not a regular file"]),
    ("config onto a link", ["config", "BASE", "-o", "{w}/link_to_file", "--force"], ["link_to_file is not a regular"]),
    ("config onto a folder", ["config", "BASE", "-o", "{w}", "--force"], ["is not a regular file"]),
    ("config below a file", ["config", "BASE", "-o", "{w}/a_file/x.yaml"], ["a part of it is a file, not a folder"]),
    ("config under /proc", ["config", "BASE", "-o", "/proc/mpskit.yaml"], ["cannot write /proc/mpskit.yaml"]),
    ("export -o a dangling link", ["export", "{w}/not_a_run", "-o", "{w}/dangling"], ["is a link"]),
    ("config -o whose lock name is a folder", ["config", "BASE", "-o", "{w}/held.yaml"],
     [".held.yaml.lock is a folder, not mpskit's lock file", "move"]),
    ("config -o whose lock name is a link", ["config", "BASE", "-o", "{w}/linked.yaml"],
     [".linked.yaml.lock is a link"]),
    ("compare over an earlier comparison", ["compare", "--out", "{w}/compared", "{w}/not_a_run"],
     ["already holds comparison.md", "new folder"]),
]

FAMILIES = {"input": INPUT_CASES, "engine": ENGINE_CASES, "record": RECORD_CASES, "file system": FILE_SYSTEM_CASES}
CASES = [case for cases in FAMILIES.values() for case in cases]


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(root.rglob("*"))
    }


def test_the_table_is_large_enough():
    assert len(CASES) >= 90


def _param(family: str, case) -> object:
    """A table row as a test: (id, words, needles), or a pytest.param of that with marks."""
    values, marks = (case.values, case.marks) if hasattr(case, "marks") else (case, ())
    return pytest.param(*values[1:], id=f"{family}: {values[0]}", marks=marks)


@pytest.mark.parametrize(
    ("words", "needles"), [_param(family, case) for family, cases in FAMILIES.items() for case in cases]
)
def test_bad_input(words, needles, tmp_path, tiny_model):
    work = tmp_path / "work"
    work.mkdir()
    make_files(work, tiny_model)
    expanded = []
    for word in words:
        expanded += base(tiny_model) if word == "BASE" else [word.replace("{w}", str(work))]
    before = snapshot(work)
    result = run_mpskit(*expanded, cwd=work)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "warning" not in line]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("mpskit: error:"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "; " in lines[0]  # the problem; the fix
    for needle in needles:
        assert needle in lines[0]
    assert snapshot(work) == before


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 5000), st.floats(allow_nan=True), st.text(max_size=12),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)  # fmt: skip
KEYS = st.sampled_from(
    [*RANGES, *SWITCHES, *CHOICES, *PLANNER_KEYS, "device", "run_name", "memory_budget_gb", "min_cutoff_len",
     "model_preset", "stage", "no_cuda", "use_mps_device", "gradient_checkpointing", "lora_target"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_yaml_loader(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "run.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))  # lone surrogates make invalid UTF-8 too
    try:
        assert isinstance(load_yaml(path), dict)
    except MpskitError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=15), max_size=6))
def test_fuzz_command_line_words(words):
    try:
        assert isinstance(read_run_words(words).values, dict)
    except MpskitError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=6), st.dictionaries(KEYS, VALUES, max_size=4))
def test_fuzz_merge_and_resolve(user, file_layer):
    layered = merge({"stage": "sft", "model_preset": "tiny"}, file_layer, user)
    try:
        run = resolve(layered, hardware="cpu")
    except MpskitError:
        return
    assert run.args["model_name_or_path"] and run.device == "cpu"


def test_disk_space_is_checked_before_training(tmp_path, monkeypatch):
    from mpskit.plan.advice import plan_run
    from mpskit.recipes import checks

    run = resolve({"stage": "sft", "model_preset": "qwen2.5-0.5b", "output_dir": str(tmp_path / "run")}, hardware="cpu")
    checks.check_disk(run, plan_run(run))  # this disk has room for a LoRA checkpoint
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10 * 1024**2})())
    with pytest.raises(MpskitError, match="checkpoints need about"):
        checks.check_disk(run, plan_run(run))
    full = resolve(
        {**run.args, "stage": "sft", "model_preset": "qwen2.5-0.5b", "finetuning_type": "full"}, hardware="cpu"
    )
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 3 * GB})())
    with pytest.raises(MpskitError, match="free"):  # full fine-tuning checkpoints hold the whole model
        checks.check_disk(full, plan_run(full))


@pytest.mark.parametrize(
    "number, said",
    [(errno.ENOSPC, "its disk is full; free some space"), (errno.EROFS, "its file system is read-only"),
     (errno.ENAMETOOLONG, "the name is longer than its file system takes")],
)  # fmt: skip
def test_a_write_that_fails_is_one_line_naming_the_path_and_why(number, said, tmp_path, monkeypatch, capsys,
                                                                tiny_model):
    """The writer itself fails (a disk that fills, a remount read-only): the one mapping of the error
    number that every writer uses turns it into the line."""
    from mpskit.cli import main
    from mpskit.engine import lf

    def failing_write(path, text):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(lf, "write_atomic", failing_write)
    monkeypatch.chdir(tmp_path)
    assert main(["config", *base(tiny_model), "-o", str(tmp_path / "run.yaml")]) == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mpskit: error:")]
    assert line.startswith(f"mpskit: error: cannot write {tmp_path / 'run.yaml'}: {said}"), line
    assert not (tmp_path / "run.yaml").exists()
