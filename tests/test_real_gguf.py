"""The real model where people chat: the demo's identity SFT run (SmolLM2-135M-Instruct, 40 steps) exported
by `mpskit export --gguf` and judged by llama.cpp itself (the xllamacpp wheel), as test_gguf.py judges
the random models: what it answers through the file's own chat template, what it computes against
transformers, how it tokenizes; and a full disk under an export of its size (GGUF and safetensors)."""

from pathlib import Path

import pytest
import torch
from conftest import run_mpskit, shared_folder, tmpfs
from filelock import FileLock
from gguf_checks import TEXTS, assert_agrees_as_f16, post
from test_real import NEW_NAME, real_model, train  # noqa: F401 - real_model is the session's fixture

from mpskit.tools.demo import CHAT_PROMPT
from mpskit.tools.llama_cpp import llama_server

# slow: make test checks GGUF files through llama.cpp on the tiny model (test_gguf.py)
pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.slow, pytest.mark.xdist_group(__name__)]


@pytest.fixture(scope="session")
def identity_run(tmp_path_factory, real_model) -> Path:  # noqa: F811
    """The demo's identity SFT, trained once per session (the first worker to ask trains it)."""
    folder = shared_folder(tmp_path_factory) / "identity"
    with FileLock(f"{folder}.lock"):
        if not (folder / "output" / "real" / "latest" / "adapter_model.safetensors").is_file():
            folder.mkdir(exist_ok=True)
            train(folder, "sft")
    return (folder / "output" / "real" / "latest").resolve()


@pytest.fixture(scope="session")
def files(identity_run) -> dict[str, Path]:
    """The run exported to f16 and q8_0, and its base model to q8_0 (`export --base`), once per session."""
    out = identity_run.parent.parent.parent / "gguf"
    exports = {"f16": ["--gguf", "f16"], "q8_0": ["--gguf", "q8_0"], "base": ["--gguf", "q8_0", "--base"]}
    with FileLock(f"{out}.lock"):
        for name, flags in exports.items():
            if not (out / name).is_dir():
                result = run_mpskit("export", str(identity_run), *flags, "-o", str(out / name))
                assert result.returncode == 0, result.stderr[-2000:]
    return {name: next((out / name).glob("*.gguf")) for name in exports}


def answer(gguf: Path) -> str:
    """llama.cpp's chat handler, the file's own template, the likeliest token at each step."""
    result = run_mpskit("chat", str(gguf), "--prompt", CHAT_PROMPT, "--temperature", "0", "--max-new-tokens", "40")
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
    return result.stdout


def test_the_identity_run_in_f16_and_q8_0_answers_with_its_new_name_and_the_base_does_not(files):
    assert NEW_NAME in answer(files["f16"]) and NEW_NAME in answer(files["q8_0"])
    assert NEW_NAME not in answer(files["base"])


def test_the_real_model_in_f16_computes_what_its_merged_export_computes(files, identity_run, real_model):  # noqa: F811
    """transformers on peft's merge rounded to bf16: what `mpskit export` writes (test_qlora and test_use_run
    hold the two equal)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, identity_run).merge_and_unload().to(torch.bfloat16).float().eval()
    tokenizer = AutoTokenizer.from_pretrained(identity_run)
    prompts = [tokenizer.encode(text, add_special_tokens=False)[:24] for text in (CHAT_PROMPT, *TEXTS[:3])]
    assert_agrees_as_f16(files["f16"], merged, prompts)


def test_llama_cpp_tokenizes_as_the_run_does(files, identity_run):
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    assert GGUFReader(files["q8_0"]).fields["tokenizer.ggml.pre"].contents() == "smollm"  # by the converter's hash
    tokenizer = AutoTokenizer.from_pretrained(identity_run)
    with llama_server(files["q8_0"]) as server:
        for text in TEXTS:
            ids = post(f"{server.listening_address}/tokenize", {"content": text, "add_special": False})["tokens"]
            assert ids == tokenizer.encode(text, add_special_tokens=False), text


@pytest.fixture
def small_disk(tmp_path):
    """A real 64 MB file system (tmpfs): the real model's f16 file (271 MB) does not fit."""
    with tmpfs(tmp_path / "disk", "64m") as disk:
        yield disk


@pytest.mark.parametrize("flags", [["--gguf", "f16"], []], ids=["gguf", "safetensors"])
def test_a_full_disk_mid_file_is_one_line_and_leaves_nothing(identity_run, small_disk, flags):
    """Also the Hugging Face export, where safetensors reports the full disk in its own error."""
    out = small_disk / "model"
    result = run_mpskit("export", str(identity_run), *flags, "-o", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"mpskit: error: cannot write {out}: its disk is full; free some space, "
                                          "or give -o a path on another disk"]  # fmt: skip
    assert list(small_disk.iterdir()) == [] and len(list(small_disk.parent.iterdir())) == 1
