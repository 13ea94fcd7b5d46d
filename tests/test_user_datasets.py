"""A user's own datasets, in the two formats LLaMA-Factory reads (alpaca and sharegpt), in their own
folder with their own dataset_info.json: `mpskit train stage=... dataset=... dataset_dir=...` trains
with nothing else named (the demo's evaluation set stays out of it)."""

import json

import pytest
from conftest import ROOT, run_mpskit

pytestmark = pytest.mark.e2e


def write_user_folder(folder):
    """The demo data rewritten as a user would bring it: SFT and preferences, alpaca and sharegpt."""
    sft = json.loads((ROOT / "data" / "demo_sft.json").read_text(encoding="utf-8"))[:32]
    pref = json.loads((ROOT / "data" / "demo_pref.json").read_text(encoding="utf-8"))[:32]
    files = {
        "chat_sft.json": [{"conversations": [{"from": "human", "value": row["instruction"]},
                                             {"from": "gpt", "value": row["output"]}]} for row in sft],
        "qa_sft.json": [{"question": row["instruction"], "answer": row["output"]} for row in sft],
        "pairs.json": [{"question": row["instruction"], "good": row["chosen"], "bad": row["rejected"]}
                       for row in pref],
        "chat_pairs.json": [{"conversations": [{"from": "human", "value": row["instruction"]}],
                             "chosen": {"from": "gpt", "value": row["chosen"]},
                             "rejected": {"from": "gpt", "value": row["rejected"]}} for row in pref],
    }  # fmt: skip
    info = {
        "chat_sft": {"file_name": "chat_sft.json", "formatting": "sharegpt"},
        "qa_sft": {"file_name": "qa_sft.json", "columns": {"prompt": "question", "response": "answer"}},
        "pairs": {"file_name": "pairs.json", "ranking": True,
                  "columns": {"prompt": "question", "chosen": "good", "rejected": "bad"}},
        "chat_pairs": {"file_name": "chat_pairs.json", "formatting": "sharegpt", "ranking": True,
                       "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
    }  # fmt: skip
    folder.mkdir()
    for name, rows in files.items():
        (folder / name).write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("stage", "dataset"),
    [("sft", "chat_sft"), ("sft", "qa_sft"), ("dpo", "pairs"), ("dpo", "chat_pairs"), ("foodpo", "chat_pairs")],
)
def test_a_users_own_dataset_trains_with_nothing_else_named(stage, dataset, tmp_path, tiny_model):
    folder = write_user_folder(tmp_path / "my_data")
    result = run_mpskit(
        "train", f"preset={stage}", f"dataset={dataset}", f"dataset_dir={folder}",
        f"model_name_or_path={tiny_model}", "template=qwen", "max_steps=2", "run_name=mine", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"evaluation off: dataset={dataset}" in result.stderr
    run_dir = (tmp_path / "output" / "mine" / "latest").resolve()
    assert json.loads((run_dir / "mpskit.json").read_text())["attempts"][-1]["outcome"] == "finished"
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 2
