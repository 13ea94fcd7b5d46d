"""Plain data files as datasets (`dataset=FILE` or `dataset=DIR`): each format told from its columns,
registered in the run folder's own dataset_info.json, planned and trained as a named dataset is."""

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_mpskit

from mpskit.stages import PLANNED

SFT = json.loads((ROOT / "data" / "demo_sft.json").read_text())[:24]
PAIRS = json.loads((ROOT / "data" / "demo_pref.json").read_text())[:24]
KTO = json.loads((ROOT / "data" / "demo_kto.json").read_text())[:24]


def chat(row: dict, role: str = "role", content: str = "content", user: str = "user", bot: str = "assistant"):
    return [{role: user, content: row["instruction"]}, {role: bot, content: row["output"]}]


# format -> (stage, rows, what mpskit says it read)
FORMATS = {
    "alpaca": ("sft", SFT, "alpaca (instruction, input, output)"),
    "completion": ("sft", [{"prompt": r["instruction"], "completion": r["output"]} for r in SFT],
                   "alpaca (prompt, completion)"),
    "messages": ("sft", [{"messages": chat(r)} for r in SFT], "messages (sharegpt)"),
    "conversations": ("sft", [{"conversations": chat(r, "from", "value", "human", "gpt")} for r in SFT],
                      "conversations (sharegpt)"),
    "pairs": ("dpo", [{"prompt": r["instruction"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in PAIRS],
              "preference pairs (prompt, chosen, rejected)"),
    "kto": ("kto", [{"prompt": r["instruction"], "completion": r["output"], "label": r["kto_tag"]} for r in KTO],
            "KTO (prompt, completion, label)"),
    "text": ("pt", [{"text": r["instruction"] + r["output"]} for r in SFT], "plain text (text)"),
}  # fmt: skip


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def words(stage: str, model: Path, data: str) -> list[str]:
    return [f"stage={stage}", f"model_name_or_path={model}", "template=qwen", f"dataset={data}", "cutoff_len=64"]


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_is_told_from_its_columns_planned_and_trained(name, tmp_path, tiny_model):
    stage, rows, said = FORMATS[name]
    data = write_jsonl(tmp_path / "mine" / f"{name}.jsonl", rows)
    before = sorted(p.name for p in data.parent.iterdir())
    plan = run_mpskit("plan", *words(stage, tiny_model, str(data)), cwd=tmp_path)
    assert said in plan.stderr, plan.stderr
    if stage in PLANNED:
        assert plan.returncode == 0, plan.stderr
    else:  # read, then refused as any kto or pt run is (the memory model covers sft, dpo, foodpo)
        assert plan.returncode == 2 and "the memory plan covers" in plan.stderr
    result = run_mpskit("train", *words(stage, tiny_model, str(data)), "max_steps=2", cwd=tmp_path)
    assert result.returncode == 0 and said in result.stderr, result.stderr[-3000:]
    run_dir = (tmp_path / "output" / f"{stage}-model" / "latest").resolve()
    written = yaml.safe_load((run_dir / "llamafactory.yaml").read_text())
    info = json.loads((run_dir / "dataset_info.json").read_text())
    assert written["dataset_dir"] == written["output_dir"] and info[written["dataset"]]["file_name"] == str(data)
    logged = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert logged[-1]["current_steps"] == 2 and all(math.isfinite(r["loss"]) for r in logged if "loss" in r)
    assert sorted(p.name for p in data.parent.iterdir()) == before  # nothing written beside the user's data


@pytest.mark.e2e
def test_a_folder_gives_train_and_valid_files_and_resumes_from_its_own_registration(tmp_path, tiny_model):
    folder = tmp_path / "mine"
    write_jsonl(folder / "train.jsonl", [{"messages": chat(r)} for r in SFT])
    write_jsonl(folder / "valid.jsonl", [{"messages": chat(r)} for r in SFT[:6]])
    result = run_mpskit("train", *words("sft", tiny_model, str(folder)), "num_train_epochs=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "eval_dataset" in result.stderr and "valid.jsonl" in result.stderr
    run_dir = (tmp_path / "output" / "sft-model" / "latest").resolve()
    results = json.loads((run_dir / "all_results.json").read_text())
    assert math.isfinite(results["eval_loss"])  # the valid file was evaluated on
    moved = tmp_path / "elsewhere"
    run_dir.rename(moved)  # the registration travels with the run folder
    again = run_mpskit("train", "--resume", str(moved), cwd=tmp_path)
    assert again.returncode == 0 and "already finished" in again.stderr, again.stderr[-2000:]


@pytest.mark.e2e
def test_a_data_file_that_moved_is_named_and_the_run_resumes_from_where_it_is_now(tmp_path, tiny_model):
    data = write_jsonl(tmp_path / "mine" / "train.jsonl", SFT)
    killed = run_mpskit("train", *words("sft", tiny_model, str(data)), "max_steps=4", "save_steps=2", "run_name=moved",
                        cwd=tmp_path, env={"MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP": "2"})  # fmt: skip
    assert killed.returncode != 0
    run_dir = (tmp_path / "output" / "moved" / "latest").resolve()
    assert json.loads((run_dir / "mpskit.json").read_text())["data_rows"] == {"mine_train": len(SFT)}
    now = tmp_path / "kept" / "sft.jsonl"
    now.parent.mkdir()
    data.rename(now)

    gone = run_mpskit("train", "--resume", str(run_dir), cwd=tmp_path)
    assert gone.returncode == 2 and "Traceback" not in gone.stderr
    assert gone.stderr.strip().splitlines()[-1] == (
        f"mpskit: error: {data} is gone: the run trained on it as dataset; resume with it where it is now: "
        f"mpskit train --resume {run_dir} dataset=NEWPATH"
    )
    fewer = write_jsonl(tmp_path / "fewer.jsonl", SFT[:-1])
    refused = run_mpskit("train", "--resume", str(run_dir), f"dataset={fewer}", cwd=tmp_path)
    assert refused.returncode == 2 and f"holds {len(SFT) - 1} rows; the run trained on {len(SFT)}" in refused.stderr
    assert json.loads((run_dir / "dataset_info.json").read_text())["mine_train"]["file_name"] == str(data)

    resumed = run_mpskit("train", "--resume", str(run_dir), f"dataset={now}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"'mine_train' now reads {now}" in resumed.stderr and "resuming" in resumed.stderr
    assert json.loads((run_dir / "dataset_info.json").read_text())["mine_train"]["file_name"] == str(now)
    record = json.loads((run_dir / "mpskit.json").read_text())
    assert record["attempts"][-1]["outcome"] == "finished" and record["attempts"][-1]["resumed_from"] == "checkpoint-2"
    logged = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert logged[-1]["current_steps"] == 4


def test_a_moved_file_is_refused_unless_it_is_the_data_the_run_registered(tmp_path):
    from mpskit.datasets.data_shapes import read_shape
    from mpskit.datasets.plain_data import moved_to
    from mpskit.errors import MpskitError

    data = write_jsonl(tmp_path / "a.jsonl", SFT)
    entries, args = {"a": {"file_name": str(data), **read_shape(SFT, "a.jsonl").entry}}, {"dataset": "a"}
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "p", "chosen": "c", "rejected": "r"}])
    cases = [
        ({}, {"dataset": "x"}, {"dataset": str(data)}, "reads no plain data file as dataset"),
        (entries, args, {"eval_dataset": str(data)}, "reads no plain data file as eval_dataset"),
        (entries, args, {"dataset": f"{data},{data}"}, "names 2 file(s); the run registered"),
        (entries, args, {"dataset": str(tmp_path / "nope.jsonl")}, "no such file"),
        (entries, args, {"dataset": str(pairs)}, "reads as preference pairs (prompt, chosen, rejected), not in the"),
    ]
    for registered, run_args, new_paths, said in cases:
        with pytest.raises(MpskitError, match=re.escape(said)):
            moved_to(registered, {"a": len(SFT)}, run_args, new_paths, tmp_path)
    same = write_jsonl(tmp_path / "b.jsonl", SFT)
    assert moved_to(entries, {"a": len(SFT)}, args, {"dataset": str(same)}, tmp_path)["a"]["file_name"] == str(same)
    assert moved_to(entries, {}, args, {}, tmp_path) == entries  # every file there: nothing changes


@pytest.mark.parametrize(
    "data, said",
    [
        ("odd.jsonl", "cannot tell the format"),
        ("missing.jsonl", "no such file or folder"),
        ("empty_folder", "holds no train.jsonl"),
        ("odd.jsonl,demo_sft", "mixes files with dataset names"),
        ("notes.txt", "not a .json or .jsonl file"),
    ],
)
def test_plan_and_train_refuse_the_same_plain_files(data, said, tmp_path, tiny_model):
    write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1}])
    (tmp_path / "empty_folder").mkdir()
    (tmp_path / "notes.txt").write_text("hello\n")
    for command in ("plan", "train"):
        result = run_mpskit(command, *words("sft", tiny_model, data), cwd=tmp_path)
        assert result.returncode == 2 and said in result.stderr, (command, result.stderr)
        assert not (tmp_path / "output").exists()


def test_a_stage_that_does_not_fit_the_file_is_refused_by_plan_as_by_train(tmp_path, tiny_model):
    data = write_jsonl(tmp_path / "answers.jsonl", SFT)
    for command in ("plan", "train"):
        result = run_mpskit(command, *words("dpo", tiny_model, str(data)), cwd=tmp_path)
        line = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and "not what stage dpo trains on" in line, (command, result.stderr)
        assert "give it rows with prompt, chosen and rejected, or train stage=sft" in line
        assert not (tmp_path / "output").exists()


def test_plain_data_is_registered_in_private_folders_that_plan_leaves_none_of(tmp_path, tiny_model):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    data = write_jsonl(tmp_path / "mine" / "alpaca.jsonl", SFT)
    env = {"TMPDIR": str(temporary)}
    plan = run_mpskit("plan", *words("sft", tiny_model, str(data)), cwd=tmp_path, env=env)
    assert plan.returncode == 0 and list(temporary.iterdir()) == [], plan.stderr
    kept = []
    for name in ("one.yaml", "two.yaml"):
        config = run_mpskit("config", *words("sft", tiny_model, str(data)), "-o", name, cwd=tmp_path, env=env)
        assert config.returncode == 0, config.stderr
        kept.append(Path(yaml.safe_load((tmp_path / name).read_text())["dataset_dir"]))
    # the YAMLs' registrations stay, each in a new folder of a name no one can claim first, for this user only
    assert sorted(temporary.iterdir()) == sorted(kept) and kept[0] != kept[1]
    assert all((folder / "dataset_info.json").is_file() and folder.stat().st_mode & 0o777 == 0o700 for folder in kept)


def test_a_fifo_named_as_data_is_refused_without_reading_it(tmp_path):
    import os

    from mpskit.datasets.plain_data import register_plain_data
    from mpskit.errors import MpskitError

    os.mkfifo(tmp_path / "rows.jsonl")  # reading it would wait for a writer that never comes
    with pytest.raises(MpskitError, match="not a regular file"):
        register_plain_data({"dataset": str(tmp_path / "rows.jsonl")}, "sft")


def test_a_registered_name_wins_over_a_file_of_that_name_in_the_working_folder(tmp_path):
    (tmp_path / "demo_sft").write_text('[{"instruction": "hi", "output": "a file of the user\'s"}]')
    words = ["plan", "preset=sft", "model_preset=tiny", "dataset=demo_sft", f"dataset_dir={ROOT / 'data'}"]
    planned = run_mpskit(*words, "--hardware", "cpu", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert f"mpskit: demo_sft is the dataset of that name in {ROOT / 'data'}/dataset_info.json, not ./demo_sft " \
           "here (give ./demo_sft to read that one)" in planned.stderr  # fmt: skip
    assert "264 rows" in planned.stdout or "264 examples" in planned.stdout  # the registered set's rows


@pytest.mark.e2e
def test_rows_with_a_role_llamafactory_does_not_know_are_one_line_and_no_library_lines(tmp_path, tiny_model):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    odd = {"messages": [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "hello"}]}
    rows = tmp_path / "roles.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in [good] * 30 + [odd] * 32))
    words = ["train", "preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", f"dataset={rows}",
             "max_steps=1", "--hardware", "cpu"]  # fmt: skip
    trained = run_mpskit(*words, cwd=tmp_path)
    assert trained.returncode == 0 and trained.stdout == "", trained.stdout[-2000:] + trained.stderr[-2000:]
    assert [line for line in trained.stderr.splitlines() if not line.startswith("mpskit")] == []
    assert "30 of 62 rows (32 a turn of role 'wizard'" in trained.stderr
