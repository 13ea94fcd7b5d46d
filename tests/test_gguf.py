"""GGUF files as llama.cpp itself reads them: every check runs the file through llama.cpp (the xllamacpp
wheel: llama-server's own handlers), never through a reader of ours.

- Each covered architecture, built here with random weights (q/k/v biases, grouped KV heads, tied and
  untied embeddings, Qwen3's q/k norms and head width, Llama 3's rope scaling, Mistral): llama.cpp's
  greedy tokens, scored by transformers on the same ids, agree in argmax and log-probability.
- A LoRA adapter merged before Llama's q/k rows are reordered; q8_0 and q4_0 within looser bounds.
- The tokenizer: llama.cpp's ids for texts in several scripts, code and emoji are transformers' ids, for
  a vocabulary trained here under GPT-2's and under Qwen2's pre-tokenizer; another is refused.
- `mpskit export RUN --gguf` on a trained tiny run: the file and its Modelfile, whose TEMPLATE (Go's
  own text/template, as Ollama renders it) gives what llama.cpp's chat template gives; a kill mid-file,
  and an existing target; `mpskit chat FILE.gguf` and `mpskit serve`.
The real model's export (its trained identity through the file's own template, its tokenizer, a full
disk) is in test_real.py."""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_mpskit
from gguf_checks import TEXTS, agreement, assert_agrees_as_f16, post, prompt_ids

from mpskit.errors import MpskitError
from mpskit.export.gguf_file import plan_model, write_gguf
from mpskit.export.vocabulary import QWEN2_PATTERN, read_vocabulary
from mpskit.tools.llama_cpp import llama_server

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group(__name__)]
SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 256}  # fmt: skip
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}  # fmt: skip
ARCHITECTURES = {  # name: (transformers' config class, its settings)
    "qwen2-tied": ("Qwen2Config", {"tie_word_embeddings": True}),  # q/k/v biases, grouped KV heads
    "qwen2-untied": ("Qwen2Config", {"tie_word_embeddings": False}),
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True, "head_dim": 32}),  # q/k norms, heads wider than hidden/4
    "llama3.1": ("LlamaConfig", {"tie_word_embeddings": False, "rope_parameters": LLAMA3_ROPE}),
    "mistral": ("MistralConfig", {"tie_word_embeddings": False, "sliding_window": None}),
}


def random_model(folder: Path, architecture: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A model of ARCHITECTURE with random weights wide enough for peaked next-token distributions, every
    norm and bias random too (a norm left at 1 or a bias at 0 would hide a misplaced one), saved in bf16
    with the tokenizer of TOKENIZER_DIR."""
    import transformers

    config_class, settings = ARCHITECTURES[architecture]
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = getattr(transformers, config_class)(**SHAPE, **settings, vocab_size=len(tokenizer), initializer_range=0.1,
                                                 eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                parameter.normal_(0, 0.5)
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def export(model: Path, out: Path, file_type: str = "f16", adapter: Path | None = None) -> Path:
    """What `mpskit export --gguf` writes for a model folder (its own tokenizer and chat template)."""
    shape, tensors = plan_model(model, adapter, file_type)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    vocabulary = read_vocabulary(model, tokenizer, shape.vocab, tokenizer.chat_template or "{{ messages }}", None)
    write_gguf(out, model.name, shape, vocabulary, tensors, file_type)
    return out


def reference(model_dir: Path, adapter: Path | None = None):
    """transformers' model in float32 from the bf16 folder; with ADAPTER, peft's merge stored in bf16, as
    `mpskit export` stores a merge."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload().to(torch.bfloat16).float().eval()
    return model


@pytest.fixture(scope="module")
def tokenizer_dir(tiny_model) -> Path:
    return tiny_model


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_each_covered_architecture_in_f16_computes_what_transformers_computes(tmp_path, tokenizer_dir, architecture):
    model_dir = random_model(tmp_path / architecture, architecture, tokenizer_dir)
    gguf = export(model_dir, tmp_path / "model.f16.gguf")
    assert_agrees_as_f16(gguf, reference(model_dir), prompt_ids(model_dir))


def test_a_lora_adapter_is_merged_before_llamas_q_and_k_rows_are_reordered(tmp_path, tokenizer_dir):
    from peft import LoraConfig, get_peft_model

    model_dir = random_model(tmp_path / "llama", "llama3.1", tokenizer_dir)
    torch.manual_seed(1)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    adapted = get_peft_model(reference(model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                              init_lora_weights=False))  # fmt: skip
    adapted.save_pretrained(tmp_path / "adapter")  # B random too: the adapter changes what the model says
    gguf = export(model_dir, tmp_path / "merged.f16.gguf", adapter=tmp_path / "adapter")
    merged = reference(model_dir, tmp_path / "adapter")
    assert_agrees_as_f16(gguf, merged, prompt_ids(model_dir))
    base_share, _ = agreement(export(model_dir, tmp_path / "base.f16.gguf"), merged, prompt_ids(model_dir))
    assert base_share < 0.9  # without the adapter the file says something else


@pytest.mark.parametrize("file_type, least_agreement, median_difference", [("q8_0", 0.9, 0.05), ("q4_0", 0.5, 0.5)])
def test_quantized_files_stay_near_what_transformers_computes(tmp_path, tokenizer_dir, file_type, least_agreement,
                                                              median_difference):  # fmt: skip
    """q8_0 keeps 8 bits a weight and q4_0 4 (the embeddings q8_0): looser than f16, and stated here."""
    model_dir = random_model(tmp_path / "qwen2", "qwen2-untied", tokenizer_dir)
    gguf = export(model_dir, tmp_path / f"model.{file_type}.gguf", file_type)
    share, differences = agreement(gguf, reference(model_dir), prompt_ids(model_dir))
    assert share >= least_agreement and statistics.median(differences) <= median_difference, (share, differences)


def qwen2_split_tokenizer(folder: Path, data: Path) -> Path:
    """A byte-level BPE trained here under Qwen2's own pre-tokenizer (its split pattern, NFC)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(QWEN2_PATTERN), "isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    bpe.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    bpe.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=special, initial_alphabet=byte_level.alphabet(),
                                  show_progress=False)  # fmt: skip
    texts = [json.dumps(row) for path in sorted(data.glob("*.json")) for row in json.loads(path.read_text())]
    bpe.train_from_iterator(texts + TEXTS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("pre_tokenizer", ["gpt-2", "qwen2"])
def test_llama_cpp_tokenizes_as_transformers_does(tmp_path, tokenizer_dir, pre_tokenizer):
    """Vocabularies llama.cpp has no hash for: their configuration names the pre-tokenizer it implements."""
    from transformers import AutoTokenizer

    source = tokenizer_dir if pre_tokenizer == "gpt-2" else qwen2_split_tokenizer(tmp_path / "tok", ROOT / "data")
    model_dir = random_model(tmp_path / "model", "qwen2-tied", source)
    gguf = export(model_dir, tmp_path / "model.gguf", "q8_0")
    from gguf import GGUFReader

    assert GGUFReader(gguf).fields["tokenizer.ggml.pre"].contents() == pre_tokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with llama_server(gguf) as server:
        for text in TEXTS:
            ids = post(f"{server.listening_address}/tokenize", {"content": text, "add_special": False})["tokens"]
            assert ids == tokenizer.encode(text, add_special_tokens=False), text


def test_a_pre_tokenizer_llama_cpp_does_not_implement_is_refused(tmp_path, tokenizer_dir):
    model_dir = random_model(tmp_path / "model", "qwen2-tied", tokenizer_dir)
    described = json.loads((model_dir / "tokenizer.json").read_text())
    described["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, {**described["pre_tokenizer"]}]}  # fmt: skip
    (model_dir / "tokenizer.json").write_text(json.dumps(described))
    with pytest.raises(MpskitError, match="llama.cpp implements no pre-tokenizer known to match"):
        export(model_dir, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_an_architecture_outside_the_covered_ones_is_one_line(tmp_path, tokenizer_dir):
    model_dir = random_model(tmp_path / "model", "qwen2-tied", tokenizer_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["PhiForCausalLM"]}))
    with pytest.raises(MpskitError) as raised:
        plan_model(model_dir, None, "f16")
    assert "does not cover PhiForCausalLM" in str(raised.value) and "Qwen3ForCausalLM" in str(raised.value)


# `mpskit export RUN --gguf`, chat and serve on a run trained through LLaMA-Factory


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_model) -> Path:
    """A finished 3-step LoRA SFT run of the tiny model (its `qwen` template)."""
    work = tmp_path_factory.mktemp("gguf_run")
    result = run_mpskit(
        "train", "preset=sft", "model_preset=tiny", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}",
        "max_steps=3", "eval_strategy=no", "learning_rate=0.05", "run_name=tiny", "--hardware", "cpu", cwd=work,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return (work / "output" / "tiny" / "latest").resolve()


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory) -> tuple[Path, str]:
    """The run exported to q8_0 through the command line: the file and the line the export ended with."""
    out = tmp_path_factory.mktemp("exported") / "gguf"
    result = run_mpskit("export", str(tiny_run), "--gguf", "q8_0", "-o", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    return out / "tiny.q8_0.gguf", result.stderr


def test_the_export_writes_the_file_and_a_modelfile_and_says_how_to_run_them(exported):
    gguf, stderr = exported
    assert sorted(path.name for path in gguf.parent.iterdir()) == ["Modelfile", "tiny.q8_0.gguf"]
    modelfile = (gguf.parent / "Modelfile").read_text()
    assert modelfile.splitlines()[2] == "FROM ./tiny.q8_0.gguf" and 'PARAMETER stop "<|im_end|>"' in modelfile
    [line] = stderr.strip().splitlines()
    assert line.startswith(f"mpskit: wrote {gguf} (") and f"ollama create tiny -f {gguf.parent}/Modelfile" in line
    assert f"llama-cli -m {gguf}" in line and f"mpskit chat {gguf}" in line


def test_a_run_exported_to_f16_computes_what_its_hugging_face_export_computes(tiny_run, tmp_path):
    """The LoRA run through both exports (its adapter merged into the bf16 base either way)."""
    assert run_mpskit("export", str(tiny_run), "--gguf", "f16", "-o", str(tmp_path / "gguf")).returncode == 0
    assert run_mpskit("export", str(tiny_run), "-o", str(tmp_path / "hf")).returncode == 0
    assert_agrees_as_f16(tmp_path / "gguf" / "tiny.f16.gguf", reference(tmp_path / "hf"), prompt_ids(tmp_path / "hf"))


def test_the_modelfile_template_renders_a_conversation_as_the_files_chat_template_does(exported, tmp_path):
    """Go's own text/template renders the TEMPLATE with what Ollama gives it (the SYSTEM line where the
    conversation has none, the messages); llama.cpp renders the file's own chat template."""
    go_template = pytest.importorskip("go_template", reason="Go's text/template binding is built for Linux x86_64")
    gguf, _ = exported
    conversation = [{"role": "user", "content": "Who made you?"}, {"role": "assistant", "content": "Larkspur Labs."},
                    {"role": "user", "content": "And your name, with \"quotes\" & <tags>?"}]  # fmt: skip
    modelfile = (gguf.parent / "Modelfile").read_text()
    template = modelfile.split('TEMPLATE """', 1)[1].split('"""', 1)[0]
    system = modelfile.split('SYSTEM """', 1)[1].split('"""', 1)[0]
    (tmp_path / "t.tmpl").write_text(template)
    values = {"System": system, "Messages": [{"Role": m["role"], "Content": m["content"]} for m in conversation]}
    (tmp_path / "values.yml").write_text(json.dumps(values))  # JSON is YAML
    go_template.render_template(str(tmp_path / "t.tmpl"), str(tmp_path / "values.yml"), str(tmp_path / "out.txt"))
    with llama_server(gguf) as server:
        rendered = post(f"{server.listening_address}/apply-template", {"messages": conversation})["prompt"]
    assert rendered.startswith("<|im_start|>system\nYou are Qwen") and rendered.count("<|im_start|>") == 5
    assert (tmp_path / "out.txt").read_text() == rendered


def test_chat_runs_a_gguf_file_through_llama_cpp(exported):
    gguf, _ = exported
    result = run_mpskit("chat", str(gguf), "--prompt", "Hi", "--max-new-tokens", "5", "--temperature", "0")
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
    again = run_mpskit("chat", str(gguf), "--prompt", "Hi", "--max-new-tokens", "5", "--temperature", "0")
    assert result.stdout.endswith("\n") and again.stdout == result.stdout  # greedy: the same answer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_answers_an_openai_client_and_stops_on_sigint_freeing_the_port(tiny_run, tmp_path):
    """A run folder served: exported to a temporary q8_0 file first, which goes when the server stops."""
    port = free_port()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "mpskit.cli", "serve", str(tiny_run), "--port", str(port)],
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "TMPDIR": str(temporary)})  # fmt: skip
    try:
        lines = [server.stderr.readline()]  # "exporting ...", then "serving ... at ADDRESS" (or the end)
        while lines[-1] and "serving" not in lines[-1]:
            lines.append(server.stderr.readline())
        assert f"at http://127.0.0.1:{port}/v1" in lines[-1], "".join(lines) + server.stderr.read()
        [exported_to] = temporary.iterdir()
        answer = post(f"http://127.0.0.1:{port}/v1/chat/completions",
                      {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})  # fmt: skip
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] > 0
        models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30).read())
        assert [entry["id"] for entry in models["data"]] == ["tiny.q8_0"]
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0
    finally:
        server.kill()
    assert "stopped" in server.stderr.read() and not exported_to.exists()
    with socket.socket() as probe:  # no one listens there any more (a server binds as this one does)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


def test_serve_on_a_port_in_use_is_one_line(exported):
    gguf, _ = exported
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_mpskit("serve", str(gguf), "--port", str(port))
    assert result.returncode == 2
    said = f"mpskit: error: port {port} on 127.0.0.1 is in use; give --port another number"
    assert result.stderr.splitlines() == [said]


def test_an_existing_target_is_refused_and_left_as_it_was(tiny_run, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "file").write_text("mine too")
    for target in (tmp_path / "taken", tmp_path / "file"):
        result = run_mpskit("export", str(tiny_run), "--gguf", "q8_0", "-o", str(target))
        assert result.returncode == 2 and "already exists" in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine" and (tmp_path / "file").read_text() == "mine too"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file", "taken"]


def test_an_export_killed_mid_file_leaves_nothing_under_its_name_and_the_next_one_succeeds(tiny_run, tmp_path):
    out = tmp_path / "gguf"
    command = [sys.executable, "-m", "mpskit.cli", "export", str(tiny_run), "--gguf", "f16", "-o", str(out)]
    kill = {**os.environ, "MPSKIT_FAKE_KILL_IN_GGUF": "5"}  # fresh: the fault is read as the interpreter starts
    killed = subprocess.run(command, env=kill, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists() and [path.name for path in tmp_path.iterdir() if path.name.startswith(".gguf.partial")]
    again = run_mpskit("export", str(tiny_run), "--gguf", "f16", "-o", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(path.name for path in out.iterdir()) == ["Modelfile", "tiny.f16.gguf"]
    assert [path.name for path in tmp_path.iterdir()] == ["gguf"]  # the killed writer's leftover is gone
    with llama_server(out / "tiny.f16.gguf") as server:
        assert server.handle_completions({"prompt": "Hi", "max_tokens": 2})["usage"]["completion_tokens"] == 2


def test_without_xllamacpp_chat_says_how_to_install_it(exported, tmp_path):
    gguf, _ = exported
    (tmp_path / "xllamacpp.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "mpskit.cli", "chat", str(gguf), "--prompt", "Hi"], env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["mpskit: error: running a GGUF file needs llama.cpp's Python wheel, "
                                          "xllamacpp; pip install 'mpskit[gguf]' (make install brings it)"]  # fmt: skip

