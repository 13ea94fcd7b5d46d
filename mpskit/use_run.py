"""Use what a run made: chat with its adapter, or merge it into a standalone model, both through
LLaMA-Factory's own chat engine and export (`llamafactory-cli chat` / `export` with the run's
model, adapter and template filled in). The run's environment is set, and MPS hidden when the run
hid it, before LLaMA-Factory (and torch) load."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import yaml

from mpskit.errors import MpskitError
from mpskit.rundir import YAML, is_run_dir, latest_run_dir, read_record

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
EXPORT_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # else float32: what the run trained in


def inference_args(run_dir: str | Path | None) -> dict:
    """LLaMA-Factory's inference arguments for a finished run's adapter (default: the newest run)."""
    from mpskit.train import enter_run_environment

    run_dir = Path(run_dir).resolve() if run_dir else latest_run_dir()
    if not is_run_dir(run_dir):
        raise MpskitError(f"{run_dir} is not an mpskit run directory", "give a folder that holds mpskit.json")
    missing = [name for name in ADAPTER_FILES if not (run_dir / name).is_file()]
    if missing:
        raise MpskitError(
            f"{run_dir} has no finished adapter ({missing[0]} missing)",
            f"finish the run first: mpskit train --resume {run_dir}",
        )
    record = read_record(run_dir)
    enter_run_environment(record)
    args = yaml.safe_load((run_dir / YAML).read_text(encoding="utf-8"))
    keys = ("model_name_or_path", "template", "finetuning_type", "trust_remote_code", "cache_dir")
    dtype = next((name for key, name in EXPORT_DTYPES.items() if args.get(key)), "float32")
    return {
        **{key: args[key] for key in keys if key in args},
        "adapter_name_or_path": str(run_dir),
        "infer_backend": "huggingface",
        "infer_dtype": dtype,
    }


def chat(run_dir: str | Path | None, prompt: str | None = None, max_new_tokens: int = 256) -> None:
    """One answer to `prompt`, or a loop on standard input (`exit` ends it, `clear` forgets)."""
    args = inference_args(run_dir)
    with contextlib.redirect_stdout(sys.stderr):  # LLaMA-Factory logs to stdout; there, only answers
        from llamafactory.chat import ChatModel

        model = ChatModel({**args, "max_new_tokens": max_new_tokens})
    if prompt is not None:
        print(model.chat([{"role": "user", "content": prompt}])[0].response_text)
        return
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
        answer = "".join(print(piece, end="", flush=True) or piece for piece in model.stream_chat(messages))
        print()
        messages.append({"role": "assistant", "content": answer})


def export(run_dir: str | Path | None, out_dir: str | Path) -> Path:
    """The base model with the run's LoRA merged in, as a Hugging Face model folder (a new or empty one)."""
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise MpskitError(f"{out} already exists and is not an empty folder", "give -o a new folder")
    args = inference_args(run_dir)
    with contextlib.redirect_stdout(sys.stderr):  # LLaMA-Factory's log lines
        from llamafactory.train.tuner import export_model

        export_model({**args, "export_dir": str(out)})
    return out
