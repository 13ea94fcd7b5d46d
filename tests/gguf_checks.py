"""llama.cpp's own judgement of a GGUF file, shared by the tests that export one: its greedy tokens and
their log-probabilities (llama-server's /completion, through the xllamacpp wheel) against a transformers
model on the same ids, and texts for tokenizers."""

import json
import urllib.request
from pathlib import Path

import torch

from mpskit.tools.llama_cpp import llama_server

TEXTS = [  # several scripts, code and emoji, for the tokenizer
    "The quick brown fox jumps over the lazy dog, isn't it?  Twice!",
    "Grüße aus Köln, ¿qué tal? Привет, мир. 你好，世界。こんにちは",
    'def add(a, b):\n    return a + b  # sum\n\nprint(add(3, 4) == 7)\t{"k": [1, 22, 333]}',
    "🚀 launch 😶\u200d🌫️ fog ✅ done 🦙🦙 llamas 👍🏽",
    "   leading spaces\n\n\ntrailing\t\t tabs 3.14159 1,000,000 $100 e=mc^2",
]
F16_AGREEMENT, F16_LOGPROB = 0.9, 0.05  # the least share of argmax agreement, the largest log-probability difference


def llama_greedy(gguf: Path, prompts: list[list[int]], tokens: int = 24) -> list[tuple[list[int], list[float | None]]]:
    """llama.cpp's greedy continuation of each prompt (token ids in, no BOS added), and the log-probability
    it gives each token. llama-server reports none for a token whose bytes are no whole UTF-8 text (a
    byte-level token of half a character): None there."""
    found = []
    with llama_server(gguf) as server:
        for prompt in prompts:
            request = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "n_probs": 1, "return_tokens": True,
                       "cache_prompt": False, "ignore_eos": True}  # fmt: skip
            result = post(f"{server.listening_address}/completion", request)
            reported = iter(result["completion_probabilities"] or [])
            entry, logprobs = next(reported, None), []
            for token in result["tokens"]:  # a skipped token's twin, the same id, is skipped too
                logprobs.append(entry["logprob"] if entry and entry["id"] == token else None)
                entry = next(reported, None) if logprobs[-1] is not None else entry
            found.append((result["tokens"], logprobs))
    return found


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=120).read())


def agreement(gguf: Path, model, prompts: list[list[int]]) -> tuple[float, list[float]]:
    """llama.cpp's greedy tokens scored by transformers' MODEL on the same ids: the share of positions
    where transformers' argmax is llama.cpp's token, and the log-probability difference at each position
    llama.cpp reports one for (most of them)."""
    agree, differences, positions = 0, [], 0
    for prompt, (tokens, logprobs) in zip(prompts, llama_greedy(gguf, prompts), strict=True):
        with torch.no_grad():
            scores = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), -1)
        for step, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
            row = scores[len(prompt) - 1 + step]
            agree += int(row.argmax().item() == token)
            differences += [abs(row[token].item() - logprob)] if logprob is not None else []
            positions += 1
    assert len(differences) >= positions / 2, (len(differences), positions)  # the bound below holds on most
    return agree / positions, differences


def assert_agrees_as_f16(gguf: Path, model, prompts: list[list[int]]) -> None:
    """An f16 file computes what MODEL computes: argmax agreement at F16_AGREEMENT of the positions or more,
    log-probabilities within F16_LOGPROB."""
    share, differences = agreement(gguf, model, prompts)
    assert share >= F16_AGREEMENT and max(differences) <= F16_LOGPROB, (share, max(differences))


def prompt_ids(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(text, add_special_tokens=False)[:24] for text in TEXTS[:4]]
