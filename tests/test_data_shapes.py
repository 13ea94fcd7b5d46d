"""Datasets in the shapes they ship in (tests/data/shapes: each the layout of its public source, made-up
text): told from their rows, the stage following the data, planned, trained for two steps through
`mpskit train`, and the registered dataset_info.json read by plain `llamafactory-cli train` to the same
first-step loss. Rows that do not read are counted by why."""

import json

import pytest
import yaml
from conftest import ROOT, run_llamafactory_cli, run_mpskit

from mpskit.datasets.data_shapes import for_stage, read_shape
from mpskit.errors import MpskitError

SHAPES = ROOT / "tests" / "data" / "shapes"
# file -> (the stage its rows train when none is named, what mpskit says it read)
EXPECTED = {
    "ultrafeedback_binarized.jsonl": ("dpo", "preference, whole conversations chosen and rejected"),
    "trl_conversational_preference.jsonl": ("dpo", "preference, prompt and answers as messages (TRL conversational)"),
    "trl_implicit_prompt_conversational.jsonl": ("dpo", "preference, whole conversations chosen and rejected"),
    "trl_implicit_prompt.jsonl": ("dpo", "preference, chosen and rejected texts with a shared prompt"),
    "hh_rlhf.jsonl": ("dpo", "preference, Human/Assistant transcripts (Anthropic HH-RLHF)"),
    "llamafactory_sharegpt_preference.json": ("dpo", "preference, conversations + chosen/rejected"),
    "llamafactory_kto.json": ("kto", "KTO, messages + label (LLaMA-Factory's)"),
    "trl_conversational_kto.jsonl": ("kto", "KTO, prompt and completion as messages + label"),
    "trl_conversational_completion.jsonl": ("sft", "prompt and completion as messages (TRL conversational)"),
    "openai_messages_system.jsonl": ("sft", "messages (sharegpt)"),
    "alpaca_history.json": ("sft", "alpaca (instruction, input, output, history)"),
}
WORDS = ["template=qwen", "cutoff_len=64", "logging_steps=1", "eval_strategy=no", "save_strategy=no"]
# The other stages preference rows serve, each trained on one shape (the rest name no stage).
NAMED_STAGE = {"hh_rlhf.jsonl": "rm", "trl_implicit_prompt.jsonl": "foodpo"}


def rows_of(name: str) -> list:
    text = (SHAPES / name).read_text()
    return json.loads(text) if name.endswith(".json") else [json.loads(line) for line in text.splitlines()]


def losses(folder) -> list[float]:
    rows = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def test_every_shape_is_told_from_its_rows_with_every_row_read():
    assert sorted(EXPECTED) == sorted(path.name for path in SHAPES.iterdir())
    for name, (_, words) in EXPECTED.items():
        shape = read_shape(rows_of(name), name)
        assert words in shape.words and shape.said().endswith(f"{len(rows_of(name))} rows"), (name, shape.said())
        assert not shape.bad and 8 <= shape.rows <= 20


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_shape_plans_trains_its_stage_and_reads_as_plain_llamafactory_reads_it(name, tmp_path, tiny_model):
    stage, words = EXPECTED[name]
    given = [f"model_name_or_path={tiny_model}", f"dataset={SHAPES / name}", *WORDS]
    if name in NAMED_STAGE:
        stage = NAMED_STAGE[name]
        given.append(f"stage={stage}")
    plan = run_mpskit("plan", *given, cwd=tmp_path)
    assert words in plan.stderr, plan.stderr[-2000:]
    assert (f"mpskit: stage {stage}, as {name} holds" in plan.stderr) == (name not in NAMED_STAGE)
    trained = run_mpskit("train", *given, "max_steps=2", "run_name=shape", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run_dir = (tmp_path / "output" / "shape" / "latest").resolve()
    written = yaml.safe_load((run_dir / "llamafactory.yaml").read_text())
    assert written["stage"] == stage and written["dataset_dir"] == written["output_dir"]
    ours = losses(run_dir)
    assert len(ours) == 2 and all(loss == loss for loss in ours)

    if stage == "foodpo":
        return  # LLaMA-Factory has no fooDPO: tests/test_foodpo_e2e.py compares it with DPO on the same data
    reference = tmp_path / "cli"  # LLaMA-Factory alone, on the folder's dataset_info.json and files
    plain = run_llamafactory_cli("train", str(run_dir / "llamafactory.yaml"), f"output_dir={reference}",
                                 f"dataset_dir={run_dir}", "max_steps=1", cwd=tmp_path)  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert ours[0] == pytest.approx(losses(reference)[0], rel=1e-5)


@pytest.mark.e2e
def test_preference_pairs_under_sft_train_the_chosen_answers_after_a_line_that_says_so(tmp_path, tiny_model):
    name = "ultrafeedback_binarized.jsonl"  # it has a `messages` column too: once read as plain SFT data, silently
    given = [f"model_name_or_path={tiny_model}", f"dataset={SHAPES / name}", "stage=sft", *WORDS, "max_steps=2"]
    trained = run_mpskit("train", *given, "run_name=chosen", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f"mpskit: {SHAPES / name} holds preference pairs: stage sft trains on the chosen answers only" in (
        trained.stderr
    )
    run_dir = (tmp_path / "output" / "chosen" / "latest").resolve()
    entry = next(iter(json.loads((run_dir / "dataset_info.json").read_text()).values()))
    rows = [json.loads(line) for line in (run_dir / entry["file_name"]).read_text().splitlines()]
    assert "ranking" not in entry and rows[0]["messages"][-1] == rows_of(name)[0]["chosen"][-1]


@pytest.mark.parametrize(
    "name, stage, said",
    [
        ("llamafactory_kto.json", "dpo", "holds KTO rows (an answer and a true/false label), which stage dpo "
                                         "does not train on; train them with stage=kto"),
        ("openai_messages_system.jsonl", "dpo", "give it rows with prompt, chosen and rejected, or train stage=sft"),
        ("hh_rlhf.jsonl", "kto", "give it rows with prompt, completion and a true/false label, or train stage=dpo"),
    ],
)  # fmt: skip
def test_data_of_another_kind_is_refused_in_one_line_with_nothing_created(name, stage, said, tmp_path, tiny_model):
    given = [f"model_name_or_path={tiny_model}", f"dataset={SHAPES / name}", f"stage={stage}", *WORDS]
    for command in ("plan", "train"):
        result = run_mpskit(command, *given, cwd=tmp_path)
        lines = [line for line in result.stderr.splitlines() if "warning" not in line and line.strip()]
        assert result.returncode == 2 and said in lines[-1], result.stderr[-2000:]
        assert not [line for line in lines if line.startswith("Traceback")]
    assert list(tmp_path.iterdir()) == []


def test_rows_that_do_not_read_are_counted_by_why_and_a_file_of_none_is_refused():
    answers = [("yes", "no"), ("same", "same"), ("", "x")]
    pairs = [{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": a}],
              "rejected": [{"role": "assistant", "content": r}]} for a, r in answers]  # fmt: skip
    shape = read_shape(pairs, "pairs.jsonl")
    assert len(shape.converted) == 1 and shape.bad == {"chosen is the rejected answer": 1, "an empty answer": 1}
    assert shape.said().endswith("1 of 3 rows (1 chosen is the rejected answer; 1 an empty answer: set aside)")
    hh = [{"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: other\n\nAssistant: c"}]
    assert read_shape(hh * 2, "hh.jsonl").bad == {"a prompt that differs between chosen and rejected": 2}
    kto = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": "yes"},
           {"messages": [{"role": "user", "content": "q"}], "label": True}]  # fmt: skip
    assert read_shape(kto, "kto.json").bad == {"a label that is not true or false": 1,
                                               "a conversation that does not end on the assistant": 1}  # fmt: skip
    alpaca = [{"instruction": "q", "output": " "}, {"instruction": "q", "output": "a"}]
    assert read_shape(alpaca, "a.json").bad == {"an empty answer": 1}
    with pytest.raises(MpskitError, match="holds KTO rows"):
        for_stage(read_shape(kto, "kto.json"), "dpo", "pairs", "kto.json")


def test_a_file_whose_rows_all_fail_to_read_is_one_line(tmp_path, tiny_model):
    data = tmp_path / "same.jsonl"
    data.write_text(json.dumps({"chosen": "Why? Because.", "rejected": "Why? Because."}) + "\n")
    result = run_mpskit("plan", f"model_name_or_path={tiny_model}", f"dataset={data}", *WORDS, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"mpskit: error: {data}: no row reads as preference, chosen and rejected texts with a shared prompt (TRL "
        "implicit prompt) (1 chosen is the rejected answer: set aside); fix the rows, or name the columns in a "
        "dataset_info.json of your own"
    )



def test_a_column_that_starts_on_a_later_row_is_the_files_column():
    rows = [{"instruction": "q", "output": "a"}, {"instruction": "q", "input": "i", "output": "a", "system": "s"}]
    columns = read_shape(rows, "late.json").entry["columns"]
    assert columns == {"prompt": "instruction", "query": "input", "response": "output", "system": "system"}
