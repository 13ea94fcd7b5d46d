"""The typed run travels: one `mpskit train` converts its settings dict to typed values a few times, enters
mpskit/settings/ as few times as it needs, and reads each config.json and dataset_info.json once.

Counted by tests/road.py (a profile of one train, its engine stubbed). The figures before this was
held (the same counter at the earlier code): 5 conversions made outside settings/ (20 with those
settings/ makes itself), 27 entries, dataset_info.json read 5 times and config.json 4 times.
"""

import json
import os

import warm
from conftest import ROOT, TIMEOUT_S

CONVERSIONS_OUTSIDE = 4  # RunSpec.of where a run folder is written and where an attempt starts; from_args in
# the planner (what was asked) and in the attempt (what llamafactory.yaml says now, edited or not)
CONVERSIONS_ALL = 16
ENTRIES = 26


def test_one_train_converts_its_settings_few_times_and_reads_each_json_once(tiny_model, tmp_path):
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "dataset=identity", "eval_dataset=identity_eval", f"output_dir={tmp_path / 'run'}",
             "max_steps=2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}  # road.py, fresh or warm
    done = warm.run("road", words, tmp_path, env, TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    road = json.loads(done.stdout.splitlines()[-1])
    assert road["exit"] == 0, done.stderr
    outside = [c for c in road["conversions"] if c["outside"]]
    said = json.dumps(road["conversions"], indent=1)
    assert sum(c["calls"] for c in outside) <= CONVERSIONS_OUTSIDE, said
    assert sum(c["calls"] for c in road["conversions"]) <= CONVERSIONS_ALL, said
    assert sum(road["entries"].values()) <= ENTRIES, json.dumps(road["entries"], indent=1)
    model_config = str((tiny_model / "config.json").resolve())
    data_info = str((ROOT / "data" / "dataset_info.json").resolve())
    assert road["reads"][model_config] == 1 and road["reads"][data_info] == 1, road["reads"]
    assert (tmp_path / "run" / "mpskit.json").is_file()  # the whole road: the run folder and its record
