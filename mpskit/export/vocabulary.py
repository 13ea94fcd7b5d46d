"""A tokenizer folder as llama.cpp reads it: a byte-level BPE vocabulary (tokens, their types, merges),
its special tokens, the end-of-turn token, the chat template, and `tokenizer.ggml.pre`, the name of
the pre-tokenizer llama.cpp reimplements.

The tokens and their types follow llama.cpp's converter (convert_hf_to_gguf.py, get_vocab_base), and
its own SpecialVocab reads the merges and special tokens. The pre-tokenizer is chosen as the converter
chooses it: the hash of a fixed text's token ids, looked up among the vocabularies llama.cpp knows.
A vocabulary trained elsewhere (the tiny model's) has a hash nobody knows; its pre-tokenizer's own
configuration then decides, where it is exactly one llama.cpp implements. Anything else is refused:
a guessed name would tokenize differently from the model's training. No torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from gguf import GGUFWriter, SpecialVocab, TokenType

from mpskit.errors import MpskitError

# llama.cpp's converter's text (get_vocab_base_pre): whitespace runs, emoji, digits, scripts, contractions
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ "
    "🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
# The hashes of that text's ids for the vocabularies of the families mpskit trains, with llama.cpp's
# names for their pre-tokenizers (convert_hf_to_gguf.py's table)
KNOWN_HASHES = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Llama 3, 3.1, 3.2
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5, 2, 2.5, 3
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM, SmolLM2
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # GPT-2's own vocabulary
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",  # Llama 3 fine-tunes
}
# Pre-tokenizers llama.cpp implements, as a tokenizer.json configures them (trim_offsets only moves
# offsets, so it is left out). Qwen2's split pattern is llama.cpp's own comment's "original regex".
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
CONFIGURED = {
    "gpt-2": ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, (None,)),
    "qwen2": (
        {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
        (None, "NFC"),  # Qwen2's own tokenizer normalizes to NFC; llama.cpp names it qwen2 all the same
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Vocabulary:
    """What llama.cpp's tokenizer and chat handler read from a GGUF file."""

    pre: str
    tokens: list[str]
    types: list[int]
    special: SpecialVocab  # merges, special token ids, whether BOS/EOS are added, the chat template
    end_of_turn: int | None

    def add_to(self, writer: GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(self.pre)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.types)
        self.special.add_to_gguf(writer, quiet=True)
        if self.end_of_turn is not None:
            writer.add_eot_token_id(self.end_of_turn)


def read_vocabulary(folder: Path, tokenizer, vocab_size: int, chat_template: str,
                    end_of_turn: str | None) -> Vocabulary:  # fmt: skip
    """TOKENIZER (transformers') as saved in FOLDER beside the model's config.json, for a model of
    VOCAB_SIZE rows."""
    described = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    if not _byte_level(described):
        kind = (described.get("model") or {}).get("type", "unknown")
        raise MpskitError(f"{folder}: the GGUF export writes byte-level BPE vocabularies, not this {kind} one "
                          "(SentencePiece-style)", "export a Hugging Face folder instead (mpskit export without "
                          "--gguf)")  # fmt: skip
    tokens, types = _tokens(tokenizer, vocab_size)
    special = SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    special.chat_template = chat_template  # the run's, not the one the tokenizer came with
    for kind, token in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id)):
        special.add_special_token[kind] = _adds(tokenizer, token, first=kind == "bos")
    eot = tokenizer.convert_tokens_to_ids(end_of_turn) if end_of_turn else None
    return Vocabulary(_pre_tokenizer(tokenizer, described, folder), tokens, types, special, eot)


def _byte_level(described: dict) -> bool:
    """A BPE model over byte-level symbols. transformers' GGUF reader also sets a byte fallback on such
    a vocabulary; it fires only for a byte the vocabulary lacks (SmolLM2 lacks 21 of 256, bytes UTF-8
    text never holds), and llama.cpp reads the same vocabulary without one."""
    model = described.get("model") or {}
    return model.get("type") == "BPE" and '"ByteLevel"' in json.dumps(described.get("pre_tokenizer"))


def _tokens(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Every id up to the model's rows: added tokens CONTROL when special (or shaped like <|...|>), else
    USER_DEFINED; rows no token uses UNUSED, named [PADn]."""
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    if max(by_id) >= vocab_size:
        raise MpskitError(f"the tokenizer has ids up to {max(by_id)}, the model {vocab_size} rows",
                          "export the tokenizer the run trained with (resize_vocab keeps them together)")  # fmt: skip
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for index in range(vocab_size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(TokenType.UNUSED)
            continue
        token = by_id[index]
        if index in added:  # llama.cpp takes added tokens as written: normalize those the tokenizer normalizes
            if not added[index].normalized:
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            looks_special = token.startswith("<|") and token.endswith("|>")
            types.append(TokenType.CONTROL if added[index].special or looks_special else TokenType.USER_DEFINED)
        else:
            types.append(TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def _adds(tokenizer, token: int | None, first: bool) -> bool:
    """Whether the tokenizer itself puts TOKEN first (or last) when it encodes a text."""
    if token is None:
        return False
    ids = tokenizer.encode("a", add_special_tokens=True)
    bare = tokenizer.encode("a", add_special_tokens=False)
    return len(ids) > len(bare) and ids[0 if first else -1] == token


def _pre_tokenizer(tokenizer, described: dict, folder: Path) -> str:
    """llama.cpp's name for the pre-tokenizer: by the hash of the check text's ids, else by the
    tokenizer's configuration where it is exactly one llama.cpp implements."""
    digest = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    if digest in KNOWN_HASHES:
        return KNOWN_HASHES[digest]
    configured = _without_offsets(described.get("pre_tokenizer"))
    normalizer = described.get("normalizer")
    normalizer_kind = None if not normalizer or normalizer == {"type": "Sequence", "normalizers": []} else (
        normalizer.get("type"))  # fmt: skip
    for name, (pre_tokenizer, normalizers) in CONFIGURED.items():
        if configured == pre_tokenizer and normalizer_kind in normalizers:
            return name
    raise MpskitError(f"{folder}: llama.cpp implements no pre-tokenizer known to match this tokenizer's "
                      f"({json.dumps(configured)[:120]})",
                      "export a Hugging Face folder instead (mpskit export without --gguf); a guessed "
                      "name would tokenize differently")  # fmt: skip


def _without_offsets(node):
    if isinstance(node, dict):
        return {key: _without_offsets(value) for key, value in node.items() if key != "trim_offsets"}
    if isinstance(node, list):
        return [_without_offsets(value) for value in node]
    return node
