"""The plan's token lengths of the training rows (mpskit/datasets/token_lengths.py) against what
LLaMA-Factory's own data pipeline makes of the same rows, and what the plan does with them."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_mpskit

from mpskit.datasets import token_lengths
from mpskit.datasets.data_shapes import read_shape
from mpskit.datasets.dataset_checks import read_rows
from mpskit.datasets.token_lengths import DataLengths, data_lengths
from mpskit.plan.advice import _cut_words
from mpskit.settings.knobs import changes, from_args

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ROOT / "tests" / "data" / "shapes"
DEMO = ROOT / "mpskit" / "data"
DEMO_INFO = json.loads((DEMO / "dataset_info.json").read_text())
MAPPED_SHAPES = ("alpaca_history.json", "openai_messages_system.jsonl", "llamafactory_sharegpt_preference.json")


def _shape_entry(path: Path) -> dict:
    return read_shape(read_rows(path), path.name).entry  # the entry `mpskit train dataset=FILE` registers


# (stage, dataset name, its file, its dataset_info.json entry)
CASES = [
    ("sft", "demo_sft", DEMO / "demo_sft.json", DEMO_INFO["demo_sft"]),
    ("dpo", "demo_pref", DEMO / "demo_pref.json", DEMO_INFO["demo_pref"]),
    *[("dpo" if "preference" in name else "sft", name.split(".")[0], SHAPES / name, _shape_entry(SHAPES / name))
      for name in MAPPED_SHAPES],
]  # fmt: skip


def _data_dir(tmp_path: Path, name: str, path: Path, entry: dict) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(path, folder / path.name)
    (folder / "dataset_info.json").write_text(json.dumps({name: {**entry, "file_name": path.name}}))
    return folder


def _llamafactory_lengths(model: Path, data: Path, name: str, stage: str, cutoff: int, out: Path
                          ) -> tuple[list[int], list[int]]:  # fmt: skip
    """Each training row's length as LLaMA-Factory tokenizes it (the longer sequence of a pair), and the
    positions it scores (labelled; the longer answer of a pair)."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.extras.constants import IGNORE_INDEX
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, training_args, *_ = get_train_args(
        {"stage": stage, "model_name_or_path": str(model), "dataset": name, "dataset_dir": str(data),
         "template": "qwen", "cutoff_len": cutoff, "output_dir": str(out), "do_train": True,
         "finetuning_type": "lora", "report_to": "none", "overwrite_cache": True}
    )  # fmt: skip
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    loaded = get_dataset(template, model_args, data_args, training_args, "rm" if stage == "dpo" else stage,
                         **tokenizer_module)["train_dataset"]  # fmt: skip

    def scored(labels: list[int]) -> int:
        return sum(label != IGNORE_INDEX for label in labels)

    if "input_ids" in loaded.column_names:
        return [len(ids) for ids in loaded["input_ids"]], [scored(labels) for labels in loaded["labels"]]
    pairs = zip(loaded["chosen_input_ids"], loaded["rejected_input_ids"], strict=True)
    answers = zip(loaded["chosen_labels"], loaded["rejected_labels"], strict=True)
    return [max(len(a), len(b)) for a, b in pairs], [max(scored(a), scored(b)) for a, b in answers]


@pytest.mark.parametrize(("stage", "name", "path", "entry"), CASES, ids=[case[1] for case in CASES])
def test_the_lengths_are_llamafactorys_own(tiny_model, tmp_path, stage, name, path, entry):
    """Row by row the same lengths as LLaMA-Factory's processors, under a cutoff that cuts none and
    one that cuts every row; the most positions a row scores as LLaMA-Factory labels them, but for the
    template's tokens that end an answer (counted with the prompt)."""
    data = _data_dir(tmp_path, name, path, entry)
    lengths, why = data_lengths({"dataset": name, "dataset_dir": str(data)}, stage, tiny_model)
    assert lengths is not None, why
    for cutoff in (4096, 16):
        theirs, scored = _llamafactory_lengths(tiny_model, data, name, stage, cutoff, tmp_path / f"out{cutoff}")
        assert sorted(min(length, cutoff) for length in lengths.tokens) == sorted(theirs)
        # the qwen template ends an answer with <|im_end|> and a newline: 2 tokens a turn, 2 turns at most here
        assert max(scored) - 4 <= lengths.longest_scored(cutoff) <= max(scored)


def test_a_large_set_is_sampled_and_its_longest_row_is_always_counted(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(token_lengths, "SAMPLE_ROWS", 20)
    rows = [{"instruction": f"question {i}", "output": "yes"} for i in range(300)]
    rows[137]["output"] = "a much longer answer " * 40
    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json"}}))
    lengths, _ = data_lengths({"dataset": "rows", "dataset_dir": str(data)}, "sft", tiny_model)
    assert lengths.rows == 300 and len(lengths.tokens) == 20  # the spread: the evenly spaced rows alone
    assert lengths.source == "token lengths of 20 of 300 rows"
    assert lengths.longest > 2 * max(lengths.tokens)  # row 137, not among them, is counted for the longest


def test_what_the_lengths_say_under_a_cutoff():
    lengths = DataLengths(tokens=(10, 20, 30, 100), rows=4, longest=100, source="token lengths of all 4 rows")
    assert lengths.longest_batch(4096) == 104 and lengths.longest_batch(64) == 64  # padded to a multiple of 8
    assert lengths.share_cut(4096) == 0 and lengths.share_cut(25) == 0.5
    assert lengths.mean(4096) == (16 + 24 + 32 + 104) / 4
    assert lengths.batch_mean(4096, 1) == pytest.approx(lengths.mean(4096))
    assert lengths.mean(4096) < lengths.batch_mean(4096, 2) < lengths.batch_mean(4096, 8) < 104
    said = "token lengths of all 4 rows: median 25 tokens, longest 100, 50% of rows cut at cutoff_len 25"
    assert lengths.summary(25) == said


def test_the_positions_a_row_scores_are_its_answer_cut_as_llamafactory_cuts_it():
    lengths = DataLengths((30, 300), rows=2, longest=300, source="all 2 rows", splits=((20, 10), (100, 200)))
    assert lengths.longest_scored(4096) == 200 and lengths.longest_scored(4096, with_prompt=True) == 300
    assert lengths.longest_scored(256) == 156  # a short prompt is kept whole, the answer fills the rest
    assert lengths.longest_scored(128) == 85 and lengths.longest_scored(128, with_prompt=True) == 128  # shared
    assert replace(lengths, splits=()).longest_scored(128) is None  # unknown: the plan counts every position


def test_with_train_on_prompt_every_position_is_scored(tiny_model):
    args = {"dataset": "demo_sft", "dataset_dir": str(DEMO)}
    answers, _ = data_lengths(args, "sft", tiny_model)
    every, _ = data_lengths({**args, "train_on_prompt": True}, "sft", tiny_model)
    assert answers.longest_scored(4096) < every.longest_scored(4096) == every.longest == answers.longest


def test_without_a_tokenizer_or_with_packing_the_plan_keeps_cutoff_len(tiny_model, tmp_path):
    args = {"dataset": "demo_sft", "dataset_dir": str(DEMO)}
    assert data_lengths(args, "sft", tmp_path) == (None, "no local tokenizer.json")
    assert data_lengths({**args, "packing": True}, "sft", tiny_model)[0] is None
    missing = data_lengths({**args, "dataset": "missing"}, "sft", tiny_model)
    assert missing == (None, "the training data cannot be read here")


def _plan(*words: str) -> dict:
    done = run_mpskit("plan", "--json", "--hardware", "m1-8gb", "preset=sft", f"dataset_dir={DEMO}", "cutoff_len=4096",
                      "template=qwen", *words)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_plan_takes_memory_at_the_longest_row_and_time_at_the_rows_own_lengths(tiny_model, tmp_path):
    """The demo's 264 short rows at cutoff_len 4096: planned at their lengths, against the same model
    with no tokenizer to count them (every row at the cap, as before)."""
    no_tokenizer = tmp_path / "config-only"
    no_tokenizer.mkdir()
    shutil.copy(tiny_model / "config.json", no_tokenizer)
    at_data = _plan(f"model_name_or_path={tiny_model}")
    at_cap = _plan(f"model_name_or_path={no_tokenizer}")
    assert at_data["lengths"]["source"] == "token lengths of all 264 rows" and at_data["lengths"]["longest"] < 100
    assert at_cap["lengths"] is None and at_cap["lengths_note"].startswith("no local tokenizer.json")
    assert at_data["chosen"]["knobs"]["cutoff_len"] == at_cap["chosen"]["knobs"]["cutoff_len"] == 4096
    data_gb, cap_gb = (plan["chosen"]["estimate"]["training_gb"] for plan in (at_data, at_cap))
    assert data_gb < cap_gb / 5
    data_s, cap_s = (plan["duration"]["predicted_s"] for plan in (at_data, at_cap))
    assert at_data["duration"]["steps"] == at_cap["duration"]["steps"]
    assert data_s < cap_s / 3  # the tiny model's steps are mostly their fixed cost
    text = run_mpskit("plan", "--hardware", "m1-8gb", "preset=sft", f"dataset_dir={DEMO}", "cutoff_len=4096",
                      f"model_name_or_path={tiny_model}", "template=qwen").stdout  # fmt: skip
    assert "at the data's longest" in text and "token lengths of all 264 rows: median" in text


def test_a_shorter_cutoff_says_what_share_of_the_rows_it_cuts():
    lengths = DataLengths(tokens=(10, 20, 30, 100), rows=4, longest=100, source="token lengths of all 4 rows")
    asked = from_args({"cutoff_len": 1024})
    said = changes(asked, replace(asked, cutoff_len=25), 1, 16, lengths.share_cut(25))
    assert said == ["cutoff_len 1024 -> 25: nothing fits at 1024 (floor 16; set min_cutoff_len to change it); "
                    "it truncates 50% of the rows"]  # fmt: skip
    assert _cut_words(lengths, 64) == "it cuts 25% of the rows: a run only for short ones"
    assert _cut_words(None, 64) == "every example cut to 64 tokens: a run only for short ones"


def test_a_chat_template_that_loops_without_end_is_counted_as_one_that_fails(tiny_model, tmp_path):
    """A model folder's chat_template.jinja may hold anything: nested loops that would render for hours,
    or a text without end, fall back to the per-turn count within the render limit."""
    import subprocess
    import sys
    import time

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    loops = "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"
    for template in (loops, "{% for a in range(99999) %}{{ 'x' * 99999 }}{% endfor %}"):
        (model / "chat_template.jinja").write_text(template)
        token_lengths._template_tokens.cache_clear()
        started = time.monotonic()
        assert token_lengths._template_tokens(None, template, ("user", "assistant")) == 2 * token_lengths.TURN_TOKENS
        assert time.monotonic() - started < 3 * token_lengths.RENDER_LIMIT_S
    words = ["plan", "preset=sft", f"model_name_or_path={model}", f"dataset_dir={DEMO}", "--hardware", "m1-8gb"]
    done = subprocess.run([sys.executable, "-m", "mpskit.cli", *words], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
