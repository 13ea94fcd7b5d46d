"""The shapes datasets ship in, told from a plain file's rows, and what LLaMA-Factory reads them as.

Each shape becomes a dataset_info.json entry: LLaMA-Factory's own column and tag mapping where one
can express it (alpaca, with `history` and `system`; ShareGPT and OpenAI messages; LLaMA-Factory's
ShareGPT preference and KTO formats; TRL's standard prompt/chosen/rejected and prompt/completion
strings), else rows converted into OpenAI messages in LLaMA-Factory's ShareGPT layout, written into
the run folder: TRL's conversational preference, KTO and prompt-completion rows, UltraFeedback-
binarized, implicit prompts (TRL's common prefix, Anthropic HH-RLHF's last "\n\nAssistant:").

A shape serves the stages of its rows' kind (stages.py: answer, pairs, kto, text); preference pairs
also train SFT on the chosen answers (`for_stage`). Rows that cannot be read as the shape says are
counted by why; a converted file leaves them out. No torch.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from mpskit.errors import MpskitError

ROLE_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
             "system_tag": "system"}  # fmt: skip
PROMPTS = ("instruction", "prompt", "question")
ANSWERS = ("output", "completion", "response", "answer")
LABELS = ("label", "kto_tag")
HUMAN, ASSISTANT = "\n\nHuman:", "\n\nAssistant:"
# The stage a shape's rows train when the user names none.
DEFAULT_STAGE = {"answer": "sft", "pairs": "dpo", "kto": "kto", "text": "pt"}


@dataclass(frozen=True)
class Shape:
    """How a file is read: its entry (no file_name), its kind of rows, how a row converts where no
    mapping can express it; once read, the rows to write in the file's place (None: LLaMA-Factory
    reads the file itself), the rows that do not read counted by why, and the file's rows."""

    words: str
    kind: str
    entry: dict
    convert: Callable[[dict], dict] | None = None
    converted: list | None = None
    bad: Counter = field(default_factory=Counter)
    source: list = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.source)

    def said(self) -> str:
        """The format told, the rows, and those set aside with why."""
        usable = self.rows - sum(self.bad.values())
        kept = f"{usable} of {self.rows} rows" if self.bad else f"{self.rows} rows"
        return f"{self.words}, {kept}" + (f" ({self.why()})" if self.bad else "")

    def why(self) -> str:
        """The rows that do not read, counted by why."""
        set_aside = "set aside" if self.converted is not None else "that will not train"
        return "; ".join(f"{count} {reason}" for reason, count in self.bad.most_common()) + f": {set_aside}"


def _messages(turns) -> bool:
    return isinstance(turns, list) and bool(turns) and all(isinstance(t, dict) and "role" in t for t in turns)


def _text(value) -> bool:
    return isinstance(value, str)


def read_shape(rows: list, where: str) -> Shape:
    """The shape of ROWS (a file's rows, read), from the first row's value types and every row's columns
    (an `input` or `system` column that starts on a later row is the file's too)."""
    if not rows or rows == [[]]:  # [] in a .jsonl file is one line holding an empty list
        raise MpskitError(f"{where} holds no rows", "give it rows (one JSON object per line, or a JSON list of them)")
    _check_one_shape(rows, where)
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    columns = set(first).union(*(row for row in rows if isinstance(row, dict)))
    shape = _shape_of(first, columns, where)
    if shape.convert is None:
        bad = Counter(reason for row in rows if (reason := _mapped_row_problem(shape, row)))
        return replace(shape, bad=bad, source=rows)
    converted, bad = [], Counter()
    for row in rows:
        try:
            converted.append(shape.convert(row if isinstance(row, dict) else {}))
        except (_BadRow, KeyError, TypeError, AttributeError) as why:
            bad[str(why) if isinstance(why, _BadRow) else "not in the file's shape"] += 1
    return replace(shape, converted=converted, bad=bad, source=rows)


OPTIONAL_COLUMNS = re.compile(r"\b(input|system|history|tools), ")  # a row may have them or not


def _check_one_shape(rows: list, where: str) -> None:
    """Every row of one shape (each told from its own columns, the optional ones aside); else one line
    naming the rows of each shape."""
    shapes: dict[str, list[int]] = {}
    for number, row in enumerate(rows, 1):
        if isinstance(row, dict):
            with contextlib.suppress(MpskitError, KeyError, TypeError):
                shapes.setdefault(OPTIONAL_COLUMNS.sub("", _shape_of(row, set(row), where).words), []).append(number)
    if len(shapes) > 1:
        said = "; ".join(f"{_spans(numbers)}: {shape}" for shape, numbers in shapes.items())
        raise MpskitError(f"the rows of {where} change shape ({said})",
                          "give every row one shape: split the file by shape, one dataset each")  # fmt: skip


def _spans(numbers: list[int], most: int = 3) -> str:
    """[1, 2, 3, 7] -> "rows 1-3, 7" (the first MOST spans, then how many rows more)."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans[:most])
    rest = sum(b - a + 1 for a, b in spans[most:])
    return f"row{'s' if len(numbers) > 1 else ''} {text}" + (f" and {rest} more" if rest else "")


class _BadRow(Exception):
    """A row that cannot be read as its file's shape; the message says why."""


def _shape_of(first: dict, columns: set, where: str) -> Shape:
    label = next((key for key in LABELS if key in columns), None)
    shape = _messages_shape(first, columns, label) or _columns_shape(first, columns, label)
    named = (*PROMPTS, *ANSWERS, "chosen", "rejected", "text")
    if shape is None and (odd := next((key for key in named if key in first and not _text(first[key])
                                       and not isinstance(first[key], list | dict)), None)):  # fmt: skip
        what = {bool: "true or false", int: "a number", float: "a number"}.get(type(first[odd]), "null")
        raise MpskitError(f"{where}: the first row's {odd} is {what}, not text", f"give every row's {odd} as text")
    if shape is None:
        raise MpskitError(
            f"cannot tell the format of {where} from its columns ({', '.join(sorted(columns)) or 'none'})",
            "give instruction/input/output, prompt/completion, messages, prompt/chosen/rejected, chosen/rejected, "
            "or text columns, or register it in a dataset_info.json of your own (dataset_dir=...)",
        )
    return shape


def _messages_shape(first: dict, columns: set, label: str | None) -> Shape | None:
    """The shapes whose turns are lists of messages (ShareGPT, TRL conversational)."""
    conversation = next((key for key in ("messages", "conversations") if key in columns), None)
    chosen, rejected = first.get("chosen"), first.get("rejected")
    if _messages(chosen) and _messages(rejected):  # TRL conversational, UltraFeedback-binarized
        if _messages(first.get("prompt")):
            return Shape("preference, prompt and answers as messages (TRL conversational)", "pairs",
                         _sharegpt(ranking=True), _conversational_pair)  # fmt: skip
        return Shape("preference, whole conversations chosen and rejected (UltraFeedback, TRL implicit prompt)",
                     "pairs", _sharegpt(ranking=True), _implicit_conversation_pair)  # fmt: skip
    if conversation and isinstance(chosen, dict) and isinstance(rejected, dict):
        entry = _sharegpt(conversation, ranking=True, tags=first[conversation])
        return Shape(f"preference, {conversation} + chosen/rejected (LLaMA-Factory's ShareGPT)", "pairs", entry)
    if conversation and label:
        entry = _sharegpt(conversation, tags=first[conversation], kto_tag=label)
        return Shape(f"KTO, {conversation} + {label} (LLaMA-Factory's)", "kto", entry)
    if conversation:
        return Shape(f"{conversation} (sharegpt)", "answer", _sharegpt(conversation, tags=first[conversation]))
    if _messages(first.get("prompt")) and _messages(first.get("completion")):
        if label:
            return Shape(f"KTO, prompt and completion as messages + {label} (TRL conversational)", "kto",
                         _sharegpt(kto_tag="label"), _conversational_kto(label))  # fmt: skip
        return Shape("prompt and completion as messages (TRL conversational)", "answer", _sharegpt(),
                     _conversational_completion)  # fmt: skip
    return None


def _columns_shape(first: dict, columns: set, label: str | None) -> Shape | None:
    """The shapes of text columns (alpaca, preference pairs, KTO, plain text)."""
    chosen, rejected = first.get("chosen"), first.get("rejected")
    prompt = next((key for key in PROMPTS if key in columns), None)
    query = {"query": "input"} if "input" in columns else {}
    system = {"system": "system"} if "system" in columns else {}
    history = {"history": "history"} if "history" in columns else {}
    if prompt and _text(chosen) and _text(rejected):
        entry = {"ranking": True, "columns": {"prompt": prompt, **query, "chosen": "chosen", "rejected": "rejected",
                                              **system, **history}}  # fmt: skip
        return Shape(f"preference pairs ({prompt}, chosen, rejected)", "pairs", entry)
    if _text(chosen) and _text(rejected):
        if HUMAN in chosen and ASSISTANT in chosen:
            return Shape("preference, Human/Assistant transcripts (Anthropic HH-RLHF)", "pairs",
                         _sharegpt(ranking=True), _hh_pair)  # fmt: skip
        return Shape("preference, chosen and rejected texts with a shared prompt (TRL implicit prompt)", "pairs",
                     _sharegpt(ranking=True), _implicit_text_pair)  # fmt: skip
    response = next((key for key in ANSWERS if key in columns), None)
    if prompt and response and label:
        entry = {"columns": {"prompt": prompt, **query, "response": response, "kto_tag": label, **system}}
        return Shape(f"KTO ({prompt}, {response}, {label})", "kto", entry)
    if prompt and response:
        entry = {"columns": {"prompt": prompt, **query, "response": response, **system, **history}}
        named = ", ".join([prompt, *query.values(), response, *history.values()])
        return Shape(f"alpaca ({named})", "answer", entry)
    if "text" in columns:
        return Shape("plain text (text)", "text", {"columns": {"prompt": "text"}})
    return None


def _sharegpt(messages: str = "messages", ranking: bool = False, tags=None, kto_tag: str | None = None) -> dict:
    """A ShareGPT entry: OpenAI's role/content tags unless the turns use ShareGPT's from/value."""
    entry: dict = {"formatting": "sharegpt", "columns": {"messages": messages}}
    if ranking:
        entry["ranking"] = True
        entry["columns"] |= {"chosen": "chosen", "rejected": "rejected"}
    if kto_tag:
        entry["columns"]["kto_tag"] = kto_tag
    if tags is None or _messages(tags):
        entry["tags"] = dict(ROLE_TAGS)
    return entry


def _mapped_row_problem(shape: Shape, row) -> str | None:
    """Why a row of a file LLaMA-Factory reads itself will not train as its shape says; None if it will."""
    if not isinstance(row, dict):
        return "not a mapping"
    columns = shape.entry["columns"]
    if shape.kind == "kto" and not isinstance(row.get(columns["kto_tag"]), bool):
        return "a label that is not true or false"
    if shape.kind == "pairs":
        chosen, rejected = row.get(columns["chosen"]), row.get(columns["rejected"])
        return _pair_problem(_content(chosen), _content(rejected))
    if "messages" in columns:
        turns = row.get(columns["messages"])
        if unknown := _unknown_role(turns):
            return f"a turn of role '{unknown}' (roles: {', '.join(KNOWN_ROLES)})"
        if shape.kind in ("answer", "kto") and not _ends_on_assistant(turns):
            return "a conversation that does not end on the assistant"
    elif shape.kind == "answer" and not str(row.get(columns["response"]) or "").strip():
        return "an empty answer"
    return None


def _content(answer):
    """An answer's text: the string itself, or a turn's content (ShareGPT's value)."""
    return answer.get("content", answer.get("value")) if isinstance(answer, dict) else answer


KNOWN_ROLES = ("system", "user", "assistant", "human", "gpt", "observation", "function_call")  # LLaMA-Factory's tags


def _unknown_role(turns) -> str | None:
    """The first role in TURNS that LLaMA-Factory's ShareGPT converter does not know."""
    for turn in turns if isinstance(turns, list) else []:
        role = turn.get("role", turn.get("from")) if isinstance(turn, dict) else None
        if isinstance(role, str) and role not in KNOWN_ROLES:
            return role
    return None


def _ends_on_assistant(turns) -> bool:
    last = turns[-1] if isinstance(turns, list) and turns and isinstance(turns[-1], dict) else {}
    return last.get("role", last.get("from")) in ("assistant", "gpt")


def _pair_problem(chosen, rejected) -> str | None:
    if not _text(chosen) or not _text(rejected) or not chosen.strip() or not rejected.strip():
        return "an empty answer"
    if chosen.strip() == rejected.strip():
        return "chosen is the rejected answer"
    return None


def _turns(messages: list) -> list[dict]:
    return [{"role": turn["role"], "content": turn["content"]} for turn in messages]


def _pair(prompt: list[dict], chosen: str, rejected: str) -> dict:
    if why := _pair_problem(chosen, rejected):
        raise _BadRow(why)
    if not prompt or prompt[-1]["role"] != "user":
        raise _BadRow("a prompt that does not end on the user")
    return {"messages": prompt, "chosen": {"role": "assistant", "content": chosen},
            "rejected": {"role": "assistant", "content": rejected}}  # fmt: skip


def _answer(turns: list) -> str:
    if not _messages(turns) or not _ends_on_assistant(turns):
        raise _BadRow("a conversation that does not end on the assistant")
    return turns[-1]["content"]


def _conversational_pair(row: dict) -> dict:
    return _pair(_turns(row["prompt"]), _answer(row["chosen"]), _answer(row["rejected"]))


def _implicit_conversation_pair(row: dict) -> dict:
    chosen, rejected = row["chosen"], row["rejected"]
    if not _messages(chosen) or not _messages(rejected) or _turns(chosen[:-1]) != _turns(rejected[:-1]):
        raise _BadRow("a prompt that differs between chosen and rejected")
    return _pair(_turns(chosen[:-1]), _answer(chosen), _answer(rejected))


def _hh_turns(text: str) -> list[dict]:
    """A Human/Assistant transcript as turns: each marker starts one."""
    turns = []
    for piece in text.split(HUMAN)[1:]:
        said, *answers = piece.split(ASSISTANT)
        turns.append({"role": "user", "content": said.strip()})
        turns += [{"role": "assistant", "content": answer.strip()} for answer in answers]
    return turns


def _hh_pair(row: dict) -> dict:
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not _text(chosen) or not _text(rejected) or ASSISTANT not in chosen or ASSISTANT not in rejected:
        raise _BadRow("not a Human/Assistant transcript")
    prompt, _, chosen_answer = chosen.rpartition(ASSISTANT)
    other, _, rejected_answer = rejected.rpartition(ASSISTANT)
    if prompt.strip() != other.strip():
        raise _BadRow("a prompt that differs between chosen and rejected")
    return _pair(_hh_turns(prompt), chosen_answer.strip(), rejected_answer.strip())


def _implicit_text_pair(row: dict) -> dict:
    """TRL's implicit prompt: the longest common start of both texts, ended at a space when one ends there."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    if not _text(chosen) or not _text(rejected):
        raise _BadRow("an empty answer")
    if chosen.strip() == rejected.strip():
        raise _BadRow("chosen is the rejected answer")
    shorter = min(len(chosen), len(rejected))
    end = next((i for i, (a, b) in enumerate(zip(chosen, rejected, strict=False)) if a != b), shorter)
    if end and chosen[end - 1] == " ":
        end -= 1
    if not chosen[:end].strip():
        raise _BadRow("no prompt shared by chosen and rejected")
    return _pair([{"role": "user", "content": chosen[:end].strip()}], chosen[end:].strip(), rejected[end:].strip())


def _conversational_completion(row: dict) -> dict:
    turns = _turns(row["prompt"]) + _turns(row["completion"]) if _messages(row.get("completion")) else []
    _answer(turns)
    return {"messages": turns}


def _conversational_kto(label: str):
    def convert(row: dict) -> dict:
        if not isinstance(row.get(label), bool):
            raise _BadRow("a label that is not true or false")
        return {**_conversational_completion(row), "label": row[label]}

    return convert


def for_stage(shape: Shape, stage: str, rows_kind: str, where: str) -> tuple[Shape, str | None]:
    """The shape as STAGE (whose rows are ROWS_KIND) reads it, and a line to say when that is not
    the whole file: preference pairs train SFT on their chosen answers. Data of another kind is refused."""
    if shape.kind == rows_kind or (rows_kind == "text" and shape.kind == "answer"):
        return shape, None
    if shape.kind == "pairs" and rows_kind == "answer":
        return _chosen_only(shape), f"{where} holds preference pairs: stage {stage} trains on the chosen answers only"
    if shape.kind == "kto":
        raise MpskitError(f"{where} holds KTO rows (an answer and a true/false label), which stage {stage} "
                          "does not train on", "train them with stage=kto")  # fmt: skip
    needs = {"pairs": "prompt, chosen and rejected", "kto": "prompt, completion and a true/false label",
             "answer": "a prompt and an answer", "text": "text"}[rows_kind]  # fmt: skip
    raise MpskitError(f"{where} holds {shape.words}, not what stage {stage} trains on",
                      f"give it rows with {needs}, or train stage={DEFAULT_STAGE[shape.kind]}")  # fmt: skip


def _chosen_only(shape: Shape) -> Shape:
    """Pairs as SFT rows: the prompt and the chosen answer."""
    entry = {key: value for key, value in shape.entry.items() if key != "ranking"}
    columns = {key: value for key, value in entry["columns"].items() if key not in ("chosen", "rejected")}
    if entry.get("formatting") == "sharegpt":  # the chosen turn after the conversation: rows of their own
        key, rows = columns["messages"], shape.converted if shape.converted is not None else shape.source
        chosen = [{key: [*row[key], row["chosen"]]} for row in rows if isinstance(row, dict)]
        return replace(shape, kind="answer", entry={**entry, "columns": columns}, converted=chosen)
    columns["response"] = shape.entry["columns"]["chosen"]
    return replace(shape, kind="answer", entry={**entry, "columns": columns})
