"""`mpskit export RUN --gguf TYPE -o DIR`: a run as one GGUF file and an Ollama Modelfile, for llama.cpp,
LM Studio and Ollama.

The run's weights stream from the base's safetensors (a LoRA run's adapter merged in, a 4-bit run's
into its 16-bit base) or from a full fine-tune's own folder (export/gguf_file.py). The tokenizer and
the chat template are the run's, as LLaMA-Factory prepared them for training: its template's special
tokens, its stop word as the end of a turn, the template rendered as Jinja into the file and as a Go
template into the Modelfile (LLaMA-Factory's own writers of both). Written as every export is: under a
hidden name, moved into place when whole (output_folder.fill).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mpskit import output_folder
from mpskit.errors import MpskitError
from mpskit.export.gguf_file import check_file_type, plan_model, write_gguf
from mpskit.export.vocabulary import Vocabulary, read_vocabulary
from mpskit.run.quiet import library_output
from mpskit.rundir.folder import RunDir, latest_run_dir
from mpskit.tools.use_run import full_model, inference_args, local_base, open_trained

MODELFILE = "Modelfile"


def export_gguf(run_dir: str | Path | None, out_dir: str | Path, file_type: str, allow_unfinished: bool = False,
                base: bool = False) -> Path:  # fmt: skip
    """The run as DIR/<run name>.<TYPE>.gguf and DIR/Modelfile (DIR new or empty); the file's path. BASE:
    the run's base model without its adapter, to compare (DIR/<run name>-base.<TYPE>.gguf)."""
    check_file_type(file_type)
    out = Path(os.path.abspath(Path(out_dir).expanduser()))
    run = RunDir.open(run_dir or latest_run_dir()) if base else open_trained(run_dir, allow_unfinished)
    name = f"{run.record.run_name}{'-base' if base else ''}"
    output_folder.fill(out, "-o", "mpskit export", "give -o a new folder",
                       lambda partial: _write_run(run, partial, name, file_type, base))  # fmt: skip
    return out / file_name(name, file_type)


def file_name(name: str, file_type: str) -> str:
    return f"{name}.{file_type}.gguf"


def _write_run(run: RunDir, folder: Path, name: str, file_type: str, base: bool = False) -> None:
    """FOLDER (empty): the run's GGUF file and its Modelfile, the run locked meanwhile."""
    with run.locked("mpskit export"):
        args = inference_args(run, quantized=False, base=base)
        full = full_model(run) and not base
        model = Path(args["model_name_or_path"]) if full else local_base(str(args["model_name_or_path"]))
        shape, tensors = plan_model(model, None if full or base else run.path, file_type)
        tokenizer = folder / ".tokenizer"
        vocabulary, modelfile = run_tokenizer(args, tokenizer, model / "config.json", shape.vocab)
        write_gguf(folder / file_name(name, file_type), name, shape, vocabulary, tensors, file_type)
        modelfile = modelfile.replace("FROM .\n", f"FROM ./{file_name(name, file_type)}\n", 1)
        (folder / MODELFILE).write_text(modelfile, encoding="utf-8")
        shutil.rmtree(tokenizer)


def run_tokenizer(args: dict, folder: Path, config: Path, vocab_size: int) -> tuple[Vocabulary, str]:
    """The run's tokenizer as LLaMA-Factory prepares it for training (saved into FOLDER beside the model's
    config.json, as llama.cpp's converter reads a model folder), and the Modelfile of its template."""
    with library_output():
        from llamafactory.data import get_template_and_fix_tokenizer
        from llamafactory.hparams import get_infer_args
        from llamafactory.model import load_tokenizer

        model_args, data_args, _, _ = get_infer_args(args)
        tokenizer = load_tokenizer(model_args)["tokenizer"]
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        tokenizer.save_pretrained(folder)
        shutil.copyfile(config, folder / "config.json")
        try:  # the template the run trained with, as Jinja (LLaMA-Factory 0.9.5's own writer of it)
            chat_template = template._get_jinja_template(tokenizer)
        except ValueError:  # a template LLaMA-Factory cannot write as Jinja: the tokenizer's own
            chat_template = tokenizer.chat_template
        if not chat_template:
            raise MpskitError(f"the run's template '{data_args.template}' has no chat template to write",
                              "give the run a template LLaMA-Factory renders as Jinja")  # fmt: skip
        end_of_turn = template.stop_words[0] if template.stop_words else None
        vocabulary = read_vocabulary(folder, tokenizer, vocab_size, chat_template, end_of_turn)
        return vocabulary, template.get_ollama_modelfile(tokenizer) + "\n"


def describe(path: Path) -> str:
    """The line an export ends with: the file, its size, and the commands that run it."""
    size = path.stat().st_size
    shown = f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
    name = path.name.rsplit(".", 2)[0]  # the run's name: <name>.<type>.gguf
    return (f"mpskit: wrote {path} ({shown}); run it: ollama create {name} -f {path.parent / MODELFILE}, "
            f"llama-cli -m {path}, or mpskit chat {path}")  # fmt: skip
