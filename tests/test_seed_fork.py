"""The seed fork's own DPO and fooDPO files (tests/data/seed_fork, unchanged): with the model and the
data swapped, each trains under mpskit or is refused in one line that names what to write today, and
where mpskit refuses, plain llamafactory-cli fails on the same file too."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_llamafactory_cli, run_mpskit

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
        plain = run_llamafactory_cli("train", *words, "max_steps=2", cwd=tmp_path)
        assert plain.returncode != 0
        return
    result = run_mpskit("train", *words, "report_to=none", "max_steps=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = next(tmp_path.rglob("mpskit.json"))
    assert json.loads(record.read_text())["attempts"][-1]["outcome"] == "finished"
    assert json.loads((record.parent / "trainer_state.json").read_text())["global_step"] == 2


SCRIPTS = sorted(str(path.relative_to(FORK)) for path in FORK.rglob("*.sh"))
# what a script's llamafactory-cli lines end as under mpskit, when not every one trains
SCRIPT_REFUSALS = {
    "scripts/compare_betadpo_strategies.sh": "stage betadpo is the seed fork's adaptive-beta DPO",
    "scripts/dpo/archive/run_qwen_dpo.sh": "does not exist",  # it copies a run file that is not beside it
    "scripts/fooDPO_example.sh": "unknown key 'evaluation_strategy'; did you mean 'eval_strategy'?",
}
SCRIPT_ARGS = {"scripts/dpo/archive/verify_qwen_foodpo.sh": ["--execute"]}  # it trains only when asked
SHIM = """#!/usr/bin/env bash
# llamafactory-cli as the seed fork's scripts call it, run by mpskit with the model and the data swapped
[[ "$1" == train ]] || exec "$REAL_CLI" "$@"  # --version and the like: LLaMA-Factory's own
shift
eval_data=()  # an eval_dataset of the script's (a word, or in its run file) becomes the demo's
if [[ " $* " == *" --eval_dataset "* ]] || grep -qs '^eval_dataset' "$1"; then
    eval_data=(eval_dataset=demo_pref_eval)
fi
"$MPSKIT_PYTHON" -m mpskit.cli train "$@" model_name_or_path="$TINY" template=qwen dataset=demo_pref \\
    dataset_dir="$DATA" "${eval_data[@]}" report_to=none max_steps=1 2>>"$SHIM_LOG.err"
echo "exit $?" >> "$SHIM_LOG"
"""


def test_every_script_of_the_fork_that_calls_llamafactory_cli_is_here():
    assert len(SCRIPTS) == 11


# several runs, or a stage and settings another script here trains as well: make test-all
SLOW_SCRIPTS = ("scripts/compare_foodpo_beta_scale.sh", "scripts/dpo/archive/verify_qwen_foodpo.sh",
                "scripts/dpo/run_qwen_dpo_beta.sh", "scripts/debug_foodpo.sh", "scripts/test_qwen_dynamic_foodpo.sh")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_SCRIPTS else []) for name in SCRIPTS]
)
def test_each_script_trains_through_mpskit_or_is_refused_in_one_line(name, tiny_model, tmp_path):
    """The script runs unchanged from a copy of the fork's folders, its `llamafactory-cli` a shim that
    hands the same words to `mpskit train` with the model, the data and report_to swapped."""
    tree = tmp_path / "fork"
    shutil.copytree(FORK, tree)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llamafactory-cli").write_text(SHIM)
    (bin_dir / "llamafactory-cli").chmod(0o755)
    log = tmp_path / "shim.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MPSKIT_PYTHON": sys.executable,
           "TINY": str(tiny_model), "DATA": str(ROOT / "data"), "SHIM_LOG": str(log),
           "REAL_CLI": str(Path(sys.executable).parent / "llamafactory-cli")}  # fmt: skip
    command = ["bash", name, *SCRIPT_ARGS.get(name, [])]
    subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    exits = log.read_text().split("exit ")[1:]
    errors = [line for line in (tmp_path / "shim.log.err").read_text().splitlines() if "mpskit: error" in line]
    assert exits, "the script called llamafactory-cli train"
    if name in SCRIPT_REFUSALS:
        assert all(code.strip() == "2" for code in exits) and len(errors) == len(exits)
        assert all(SCRIPT_REFUSALS[name] in line for line in errors), errors
    else:
        assert all(code.strip() == "0" for code in exits), errors
        runs = [path.parent for path in tree.rglob("llamafactory.yaml")]
        states = [json.loads((run / "trainer_state.json").read_text()) for run in runs]
        assert len(states) == len(exits) and all(state["global_step"] == 1 for state in states)
    # a checkpoint's state names where the checkpoint is, never the folder it was written in
    assert not any(".saving" in path.read_text() for path in tree.rglob("trainer_state.json"))
