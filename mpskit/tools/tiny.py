"""The offline demo model: a small Qwen2-architecture causal LM built locally, deterministically.

Random weights, a byte-level BPE tokenizer trained on the bundled data, and Qwen's chat template, so
LLaMA-Factory's `qwen` template works with it and nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from mpskit import output_folder
from mpskit.datasets.dataset_checks import read_rows
from mpskit.errors import MpskitError
from mpskit.presets import demo_data_dir, preset_model_dir
from mpskit.run.quiet import is_verbose

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5's chat template without tools: its default system prompt is LLaMA-Factory's `qwen` template's.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_DIMS = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
}
VOCAB_SIZE = 2048


def ensure_preset_model(data_dir: str | Path | None = None) -> tuple[Path, bool]:
    """The demo model where its preset looks, built there once: (its folder, whether it was built now)."""
    directory = preset_model_dir()
    if (directory / "config.json").is_file():
        return directory, False
    return build_tiny_model(directory, data_dir), True


def _corpus(data_dir: Path) -> list[str]:
    texts = []
    for path in sorted(data_dir.glob("demo_*.json")):  # the demo sets only: the real model's are not its
        for row in read_rows(path):
            texts += [str(value) for value in row.values() if value] if isinstance(row, dict) else []
    texts.append("system user assistant You are a helpful assistant.")
    return texts


def build_tiny_model(
    out_dir: str | Path, data_dir: str | Path | None = None, seed: int = 0, dims: dict | None = None
) -> Path:
    """Write tokenizer and random-weight Qwen2 model to out_dir. Refuses a non-empty out_dir.

    `dims` overrides Qwen2Config fields (hidden_size, ..., vocab_size) for larger random models with
    the same tokenizer, as the memory bench uses; a vocab_size above the tokenizer's leaves the extra
    embedding rows unused, as in Qwen's own checkpoints."""
    out = Path(out_dir)
    data = Path(data_dir) if data_dir else demo_data_dir()
    if not data.is_dir():
        raise MpskitError(f"data directory {data} not found", "pass --data DIR with the demo datasets")
    return output_folder.fill(out, "the model folder", "mpskit tiny-model", "choose another folder or use it as is",
                              lambda partial: _build(partial, data, seed, dims))  # fmt: skip


def _build(out: Path, data: Path, seed: int, dims: dict | None) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = _tokenizer(data)
    torch.manual_seed(seed)
    shape = {**TINY_DIMS, "vocab_size": len(tokenizer), "tie_word_embeddings": True, **(dims or {})}
    shape["vocab_size"] = max(shape["vocab_size"], len(tokenizer))
    config = Qwen2Config(
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    model = Qwen2ForCausalLM(config)
    if not is_verbose():
        hf_logging.disable_progress_bar()  # "Writing model shards" for one small file
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _tokenizer(data: Path):
    """A byte-level BPE tokenizer trained on the demo data, with Qwen's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(data), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=4096,
    )
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer
