"""Use what a run made: chat with its adapter, or merge it into a standalone model, both through
LLaMA-Factory's own chat engine and export (`llamafactory-cli chat` / `export` with the run's
model, adapter and template filled in). The run's environment is set, and MPS hidden when the run
hid it, before LLaMA-Factory (and torch) load."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from mpskit import output_folder
from mpskit.engine import bends
from mpskit.errors import MpskitError
from mpskit.run.quiet import library_output
from mpskit.rundir.folder import RunDir, latest_run_dir
from mpskit.settings.run_spec import RunSpec

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_FILES = ("config.json", "model.safetensors")  # a full fine-tune's: the run folder is the model (or its index)
EXPORT_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # else float32: what the run trained in


def open_trained(run_dir: str | Path | None, allow_unfinished: bool = False) -> RunDir:
    """A run whose adapter can be used (default: the newest run). A run that stopped before its last
    step has an adapter too (LLaMA-Factory saves one on a stop): it is used only when asked, and said."""
    run = RunDir.open(run_dir or latest_run_dir())
    if not run.finished and (holder := run.in_use_by()):
        raise MpskitError(f"{run.path} is still training ({holder})", "wait until it ends, then run this again")
    wanted = MODEL_FILES if full_model(run) else ADAPTER_FILES
    missing = [name for name in wanted if not _saved(run.path, name)]
    if missing:
        raise MpskitError(
            f"{run.path} has no finished adapter ({missing[0]} missing)",
            f"finish the run first: mpskit train --resume {run.path}",
        )
    if not run.finished:
        last = run.record.attempts[-1].outcome if run.record.attempts else "never trained"
        what = f"{run.path} did not finish ({last}; {run.step_reached()})"
        if not allow_unfinished:
            raise MpskitError(what, f"finish it: mpskit train --resume {run.path}; or add --allow-unfinished")
        print(f"mpskit: {what}; using the adapter it saved there", file=sys.stderr)
    return run


def full_model(run: RunDir) -> bool:
    """A full fine-tune (finetuning_type: full or freeze) saves the whole model into its folder."""
    return run.yaml_args().get("finetuning_type", "lora") in ("full", "freeze")


def _saved(folder: Path, name: str) -> bool:
    return (folder / name).is_file() or (name == "model.safetensors" and (folder / f"{name}.index.json").is_file())


def inference_args(run: RunDir, quantized: bool = True, base: bool = False) -> dict:
    """LLaMA-Factory's inference arguments for a run's adapter (or a full fine-tune's own folder), in the
    environment the run trained in, on the base in the bits it trained on (`quantized=False`: the 16-bit
    base, which export merges into; `base`: the base model alone)."""
    from mpskit.engine.environment import enter_run_environment

    enter_run_environment(run.record)
    args = run.yaml_args()
    keys = ("model_name_or_path", "template", "finetuning_type", "trust_remote_code", "cache_dir")
    if quantized:
        keys += ("quantization_bit", "quantization_method", "quantization_type", "double_quantization")
    dtype = next((name for key, name in EXPORT_DTYPES.items() if args.get(key)), "float32")
    chosen = {**{key: args[key] for key in keys if key in args}, "infer_backend": "huggingface", "infer_dtype": dtype}
    if base or full_model(run):  # a plain model: the base, or a full fine-tune's folder itself
        return {**chosen, "model_name_or_path": chosen["model_name_or_path"] if base else str(run.path),
                "finetuning_type": "lora"}  # fmt: skip
    return {**chosen, "adapter_name_or_path": str(run.path)}


def chat(
    run_dir: str | Path | None, prompt: str | None = None, max_new_tokens: int = 256, allow_unfinished: bool = False,
    base: bool = False, temperature: float | None = None,
) -> None:
    """One answer to `prompt`, or a loop on standard input (`exit` ends it, `clear` forgets). `base`: the
    run's base model alone (its template and bits), to compare with what training made of it. TEMPERATURE
    0 decodes greedily; None keeps LLaMA-Factory's sampling."""
    run = RunDir.open(run_dir or latest_run_dir()) if base else open_trained(run_dir, allow_unfinished)
    args = inference_args(run, base=base)
    # stdout is for the answers; the base loads as the run trained it, its vocabulary packed where it was
    with library_output(), bends.packed_vocabulary(RunSpec.of(run.train_args())):
        from llamafactory.chat import ChatModel

        model = ChatModel({**args, "max_new_tokens": max_new_tokens, **sampling_args(temperature)})
    if prompt is not None:
        print(model.chat([{"role": "user", "content": prompt}])[0].response_text)
        return
    converse(lambda messages: "".join(show(piece) or piece for piece in model.stream_chat(messages)))


def converse(respond: Callable[[list[dict]], str]) -> None:
    """A chat on standard input: RESPOND(messages) prints the answer as it comes and returns it; `clear`
    forgets the conversation, `exit` (or the end of the input) ends it."""
    print("mpskit chat: type a message; `clear` forgets the conversation, `exit` ends it", file=sys.stderr)
    messages: list[dict] = []
    while True:
        try:
            text = input("\nUser: ")
        except EOFError:
            return
        if text.strip() == "exit":
            return
        if text.strip() == "clear":
            messages = []
            continue
        messages.append({"role": "user", "content": text})
        print("Assistant: ", end="", flush=True)
        answer = respond(messages)
        print()
        messages.append({"role": "assistant", "content": answer})


def show(piece: str) -> None:
    print(piece, end="", flush=True)


def sampling_args(temperature: float | None) -> dict:
    """LLaMA-Factory's generating arguments for a temperature: 0 greedy, None its own sampling."""
    if temperature is None:
        return {}
    return {"do_sample": False} if temperature == 0 else {"temperature": temperature}


def export(run_dir: str | Path | None, out_dir: str | Path, allow_unfinished: bool = False) -> Path:
    """The base model with the run's LoRA merged in, as a Hugging Face model folder (a new or empty
    one), written as output_folder.fill writes: under a hidden name, moved into place when complete."""
    out = Path(os.path.abspath(Path(out_dir).expanduser()))
    return output_folder.fill(out, "-o", "mpskit export", "give -o a new folder",
                              lambda partial: _export(open_trained(run_dir, allow_unfinished), partial))  # fmt: skip


def _export(run: RunDir, partial: Path) -> None:
    with run.locked("mpskit export"):
        args = {**inference_args(run, quantized=False), "export_dir": str(partial)}
        with library_output():
            if run.yaml_args().get("quantization_bit"):
                _merge_by_shard(args, partial)
            else:
                from llamafactory.train.tuner import export_model

                export_model(args)


def _merge_by_shard(args: dict, out: Path) -> None:
    """A quantized run's export: its adapter merged into the 16-bit base on disk one weight at a time
    (merge_shards.py), LLaMA-Factory's tokenizer with the run's template beside it, as its export
    writes them. A 16 GB Mac thus exports the 7B model it trained in 4 bits."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import get_infer_args
    from llamafactory.model import load_tokenizer

    from mpskit.tools.merge_shards import merge_by_shard

    model_args, data_args, _, _ = get_infer_args(args)
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    get_template_and_fix_tokenizer(tokenizer, data_args)
    merge_by_shard(local_base(str(args["model_name_or_path"])), Path(args["adapter_name_or_path"]), out)
    tokenizer.padding_side = "left"  # as LLaMA-Factory's export leaves it, for generation
    tokenizer.init_kwargs["padding_side"] = "left"
    tokenizer.save_pretrained(out)


def local_base(model: str) -> Path:
    """The base's folder: a local one, or a hub model's snapshot in the cache."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from mpskit.machine.hub import hub_config_path

    return hub_config_path(model).parent
