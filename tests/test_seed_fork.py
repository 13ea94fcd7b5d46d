"""The seed fork's own DPO and fooDPO files (tests/data/seed_fork, unchanged): with the model and the
data swapped, each trains under mpskit or is refused in one line that names what to write today, and
where mpskit refuses, plain llamafactory-cli fails on the same file too."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_mpskit

FORK = ROOT / "tests" / "data" / "seed_fork"
FILES = sorted(str(path.relative_to(FORK)) for path in FORK.rglob("*.yaml"))
REFUSED = {"examples/train_lora/qwen1_5_0_5b_lora_betadpo.yaml": "stage betadpo is the seed fork's adaptive-beta DPO"}
DATA = ["dataset=demo_pref", f"dataset_dir={ROOT / 'data'}"]


def swapped(name: str, model: Path) -> list[str]:
    path = FORK / name
    words = [str(path), f"model_name_or_path={model}", "template=qwen", *DATA]  # a model comes with its template
    if "eval_dataset" in yaml.safe_load(path.read_text()):
        words.append("eval_dataset=demo_pref_eval")
    return words


def test_every_dpo_and_foodpo_file_of_the_fork_is_here():
    assert len(FILES) == 17 and {yaml.safe_load((FORK / f).read_text())["stage"] for f in FILES} == {
        "dpo", "foodpo", "betadpo"}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("name", FILES)
def test_each_file_trains_or_is_refused_in_one_line(name, tiny_model, tmp_path):
    words = swapped(name, tiny_model)
    uses_wandb = "wandb" in str(yaml.safe_load((FORK / name).read_text()).get("report_to"))
    if name in REFUSED or uses_wandb:
        result = run_mpskit("train", *words, cwd=tmp_path)
        said = REFUSED.get(name, "pip install wandb, or set report_to: none")
        assert result.returncode == 2 and said in result.stderr and not (tmp_path / "output").exists()
        assert len([line for line in result.stderr.splitlines() if "error" in line]) == 1
    if name in REFUSED:  # (report_to: wandb under plain llamafactory-cli: tests/test_user_configs.py)
        cli = Path(sys.executable).parent / "llamafactory-cli"
        plain = subprocess.run([str(cli), "train", *words, "max_steps=2"], cwd=tmp_path, capture_output=True,
                               text=True, timeout=600)  # fmt: skip
        assert plain.returncode != 0
        return
    result = run_mpskit("train", *words, "report_to=none", "max_steps=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = next(tmp_path.rglob("mpskit.json"))
    assert json.loads(record.read_text())["attempts"][-1]["outcome"] == "finished"
    assert json.loads((record.parent / "trainer_state.json").read_text())["global_step"] == 2
