"""How long the training rows are in the model's own tokens, for the plan: `cutoff_len` is a cap that
most rows never reach, so a plan at the cap overstates both the memory and the time.

The rows of each local JSON / JSON Lines training dataset are read through their dataset_info.json
entry (alpaca or sharegpt columns) and tokenized with the model's tokenizer.json by `tokenizers`
(no torch, no transformers). The template's own tokens (role markers, a default system prompt) are
counted once per conversation layout by rendering the tokenizer's chat template with empty turns.
A set larger than SAMPLE_ROWS is sampled evenly for the lengths' spread (the time), and the rows with
the most characters are tokenized as well for the longest row (the memory), which is thus not left to
chance; they do not weigh in the spread, which they would pull up.

A length is what LLaMA-Factory's processors make of a row: the conversation with the longer of the
two answers for a pair (chosen and rejected are padded to one length), before `cutoff_len` cuts it.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import math
import signal
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path

from mpskit.datasets.dataset_checks import read_rows, split_names
from mpskit.errors import MpskitError
from mpskit.files import read_json
from mpskit.stages import stage_of

SAMPLE_ROWS = 500  # rows tokenized from a larger set, evenly spaced: their mean is within a few %
LONGEST_ROWS = 64  # the rows with the most characters, tokenized whatever the sample holds
PAD_MULTIPLE = 8  # LLaMA-Factory's collators pad each batch to a multiple of 8 tokens
TURN_TOKENS = 4  # a template's tokens per turn where the tokenizer has no chat template
# A chat template renders empty turns in milliseconds; one that loops past these limits (a folder's
# chat_template.jinja may hold anything) is counted as one that fails to render.
RENDER_LIMIT_S = 1.0
RENDER_LIMIT_CHARS = 100_000


@dataclass(frozen=True)
class DataLengths:
    """Token lengths of the training rows (a sample where the set is large), before cutoff_len."""

    tokens: tuple[int, ...]  # sorted
    rows: int  # the rows they stand for
    longest: int
    source: str  # how they were counted, for the plan's lines
    # (prompt, answer) tokens of every row counted, the sample's and the longest: the template's own
    # tokens with the prompt; a pair's longer answer; all of a conversation's assistant turns
    splits: tuple[tuple[int, int], ...] = ()

    @functools.cached_property
    def padded(self) -> tuple[int, ...]:
        """Each length padded to the collator's multiple, once (the planner asks at every setting)."""
        return tuple(_padded(length) for length in self.tokens)

    def capped(self, cutoff: int) -> list[int]:
        """The padded lengths under cutoff_len (padding is monotone: padding the shorter is the shorter)."""
        cap = _padded(cutoff)
        return [min(length, cap) for length in self.padded]

    def mean(self, cutoff: int) -> float:
        """The tokens of an average row under cutoff_len (padded to the collator's multiple)."""
        return statistics.fmean(self.capped(cutoff))

    def batch_mean(self, cutoff: int, batch: int) -> float:
        """The length a micro-batch of `batch` shuffled rows pads to, on average: the expected longest
        of `batch` draws from the rows' lengths."""
        lengths, count = self.capped(cutoff), len(self.tokens)
        return sum(length * (((k + 1) / count) ** batch - (k / count) ** batch) for k, length in enumerate(lengths))

    def longest_batch(self, cutoff: int) -> int:
        """The longest batch the data can make: what the memory plan takes."""
        return _padded(min(self.longest, cutoff))

    def longest_scored(self, cutoff: int, with_prompt: bool = False) -> int | None:
        """The most positions one sequence scores under cutoff_len: its answer (and its prompt, for
        fooDPO's chosen half), cut as LLaMA-Factory cuts the row (infer_seqlen); None where unknown."""
        if not self.splits:
            return None
        cuts = (infer_seqlen(prompt, answer, cutoff) for prompt, answer in self.splits)
        return max(answer + (prompt if with_prompt else 0) for prompt, answer in cuts)

    def share_cut(self, cutoff: int) -> float:
        """The share of rows longer than cutoff_len (LLaMA-Factory truncates them)."""
        return 1 - bisect.bisect_right(self.tokens, cutoff) / len(self.tokens)

    def summary(self, cutoff: int) -> str:
        cut = self.share_cut(cutoff)
        cut_text = f"{cut:.0%} of rows cut at cutoff_len {cutoff}" if cut else f"none over cutoff_len {cutoff}"
        return (f"{self.source}: median {statistics.median(self.tokens):.0f} tokens, longest {self.longest}, "
                f"{cut_text}")  # fmt: skip

    def as_dict(self, cutoff: int) -> dict:
        return {
            "source": self.source,
            "rows": self.rows,
            "median": statistics.median(self.tokens),
            "mean_under_cutoff": round(self.mean(cutoff), 1),
            "longest": self.longest,
            "share_cut": round(self.share_cut(cutoff), 4),
        }


def _padded(length: int) -> int:
    return math.ceil(length / PAD_MULTIPLE) * PAD_MULTIPLE


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """(prompt, answer) tokens kept of a row under cutoff_len: LLaMA-Factory's rule
    (data/processor/processor_utils.py), restated here because importing it imports torch."""
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    return min(max(cutoff_len - new_target_len, 0), source_len), new_target_len


def data_lengths(args: dict, stage: str, tokenizer_dir: Path | None) -> tuple[DataLengths | None, str]:
    """The training rows' token lengths, or None and why the plan takes every row at cutoff_len."""
    if args.get("packing") or args.get("neat_packing"):
        return None, "packing fills every sequence to cutoff_len"
    if tokenizer_dir is None or not (tokenizer_dir / "tokenizer.json").is_file():
        return None, "no local tokenizer.json"
    conversations = _training_conversations(args, stage)
    if isinstance(conversations, str):
        return None, conversations
    try:
        tokenizer = read_tokenizer(tokenizer_dir / "tokenizer.json")
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises its own Exception type
        return None, f"cannot read {tokenizer_dir / 'tokenizer.json'} ({type(err).__name__})"
    total = len(conversations)
    evenly, longest_rows = _sample(conversations)
    template = _chat_template(tokenizer_dir)
    chosen = evenly + longest_rows
    texts = [text for _, turns, answers in chosen for text in [*turns, *answers]]
    counts = iter([len(encoding.ids) for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)])
    splits = []
    for roles, turns, answers in chosen:
        turn_tokens = [next(counts) for _ in turns]
        if answers:  # a pair: the longer answer
            answer = max(next(counts) for _ in answers)
        else:
            answer = sum(count for role, count in zip(roles, turn_tokens, strict=True) if role == "assistant")
        splits.append((_template_tokens(tokenizer, template, roles) + sum(turn_tokens) - (0 if answers else answer),
                       answer))  # fmt: skip
    if args.get("train_on_prompt") is True:  # SFT that scores every position
        splits = [(0, prompt + answer) for prompt, answer in splits]
    tokens = [prompt + answer for prompt, answer in splits]
    source = f"all {total} rows" if len(evenly) == total else f"{len(evenly)} of {total} rows"
    spread = tuple(sorted(tokens[: len(evenly)]))
    return DataLengths(spread, total, max(tokens), f"token lengths of {source}", tuple(splits)), ""


@functools.cache
def read_tokenizer(path: Path):
    """A tokenizer.json as `tokenizers` reads it (no torch), read once per process: the plan counts the
    rows with it, and the template check (engine/lf.py) reads its vocabulary."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


Conversation = tuple[tuple[str, ...], list[str], list[str]]  # roles, texts of the turns, the pair's answers


def _training_conversations(args: dict, stage: str) -> list[Conversation] | str:
    """Every training row as roles and texts, or why they cannot be read here."""
    dataset_dir = Path(str(args.get("dataset_dir", "data")))
    names = split_names(args.get("dataset"))
    try:
        info = read_json(dataset_dir / "dataset_info.json")
        conversations = []
        for name in names:
            entry = info[name]
            path = dataset_dir / str(entry.get("file_name", ""))
            if "file_name" not in entry or path.suffix not in (".json", ".jsonl") or not path.is_file():
                return f"dataset '{name}' is not a local JSON file"
            rows = read_rows(path)
            rows = rows[: int(args.get("max_samples") or len(rows))]
            read = (_conversation(entry, row, stage) for row in rows if isinstance(row, dict))
            conversations += [conversation for conversation in read if conversation]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, MpskitError):
        return "the training data cannot be read here"
    return conversations or "no training row could be read"


def _conversation(entry: dict, row: dict, stage: str) -> Conversation | None:
    """A row as LLaMA-Factory's converters read it: alpaca or sharegpt / openai columns, where system
    and history are read only where dataset_info.json maps them."""
    columns = entry.get("columns") or {}
    ranking = bool(entry.get("ranking")) and stage_of(stage).pairs
    turns: list[tuple[str, object]] = []
    if columns.get("system") and row.get(columns["system"]):
        turns.append(("system", row[columns["system"]]))
    if entry.get("formatting", "alpaca") == "alpaca":
        for query, answer in (row.get(columns["history"]) if columns.get("history") else None) or []:
            turns += [("user", query), ("assistant", answer)]
        prompt = [row.get(columns.get("prompt", "instruction")), row.get(columns.get("query", "input"))]
        turns.append(("user", "\n".join(str(part) for part in prompt if part)))
        answers = [row.get(columns.get(k, k)) for k in ("chosen", "rejected")] if ranking else []
        if not ranking:
            turns.append(("assistant", row.get(columns.get("response", "output"))))
    else:
        tags = entry.get("tags") or {}
        role_tag, content_tag = tags.get("role_tag", "from"), tags.get("content_tag", "value")
        assistant = (tags.get("assistant_tag", "gpt"), tags.get("function_tag", "function_call"), "assistant")
        system = (tags.get("system_tag", "system"), "system")
        for message in row[columns.get("messages", "conversations")]:
            role = message[role_tag]
            turns.append(("assistant" if role in assistant else "system" if role in system else "user",
                          message[content_tag]))  # fmt: skip
        answers = [row[columns.get(k, k)][content_tag] for k in ("chosen", "rejected")] if ranking else []
    if not all(isinstance(text, str) for _, text in turns) or not all(isinstance(text, str) for text in answers):
        return None
    roles = tuple(role for role, _ in turns) + (("assistant",) if ranking else ())
    return roles, [str(text) for _, text in turns], [str(text) for text in answers]


def _sample(conversations: list[Conversation]) -> tuple[list[Conversation], list[Conversation]]:
    """SAMPLE_ROWS evenly spaced rows (all of a smaller set), and the LONGEST_ROWS with the most
    characters that are not among them."""
    if len(conversations) <= SAMPLE_ROWS:
        return conversations, []
    step = len(conversations) / SAMPLE_ROWS
    evenly = sorted({int(i * step) for i in range(SAMPLE_ROWS)})
    size = [sum(map(len, turns)) + max(map(len, answers), default=0) for _, turns, answers in conversations]
    longest = set(sorted(range(len(conversations)), key=size.__getitem__)[-LONGEST_ROWS:]) - set(evenly)
    return [conversations[i] for i in evenly], [conversations[i] for i in sorted(longest)]


def _chat_template(tokenizer_dir: Path) -> str | None:
    """The tokenizer's chat template: chat_template.jinja (transformers 5) or tokenizer_config.json's."""
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


@functools.cache
def _template_tokens(tokenizer, template: str | None, roles: tuple[str, ...]) -> int:
    """The template's tokens around turns of these roles: the chat template rendered with empty turns."""
    if template is None:
        return TURN_TOKENS * len(roles)
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    text = ""
    try:
        with _time_limit(RENDER_LIMIT_S):
            for piece in environment.from_string(template).generate(
                messages=[{"role": role, "content": ""} for role in roles], add_generation_prompt=False,
                bos_token="", eos_token="",
            ):  # fmt: skip
                text += piece
                if len(text) > RENDER_LIMIT_CHARS:
                    raise TemplateError("too long")
    except Exception:  # noqa: BLE001 - a template this cannot render: a plain per-turn count
        return TURN_TOKENS * len(roles)
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


@contextlib.contextmanager
def _time_limit(seconds: float):
    """TimeoutError after SECONDS (a timer signal: in the main thread; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame) -> None:
        raise TimeoutError(f"past {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
