"""`mpskit eval` on the real model reports what the run's own held-out evaluation reported on the same
data: SFT by its loss on the identity run's held-out answers, DPO and fooDPO by their pairs' loss,
margin and accuracy (within 1e-4). It used to merge the adapter into the bf16 base, which rounded it."""

import json
from pathlib import Path

import pytest
from conftest import run_mpskit
from test_real import real_model, train  # noqa: F401 - real_model is the session's fixture
from test_real_gguf import identity_run  # noqa: F401 - trained once per session

pytestmark = [pytest.mark.e2e, pytest.mark.real]
FIGURES = {"sft": ("eval_loss",), "pref": ("eval_loss", "eval_rewards/margins", "eval_rewards/accuracies")}


def evaluated(run_dir: Path) -> dict:
    done = run_mpskit("eval", str(run_dir), cwd=run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    [folder] = sorted(run_dir.glob("eval/*/all_results.json"))[-1:]
    return json.loads(folder.read_text())


def assert_as_trained(run_dir: Path, keys: tuple[str, ...]) -> None:
    trained, again = json.loads((run_dir / "all_results.json").read_text()), evaluated(run_dir)
    for key in keys:
        assert again[key] == pytest.approx(trained[key], abs=1e-4), key


@pytest.mark.slow  # it evaluates test_real_gguf's identity run
def test_eval_of_the_identity_sft_run_reports_its_own_held_out_loss(identity_run):  # noqa: F811
    assert_as_trained(identity_run, FIGURES["sft"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["dpo", "foodpo"])
def test_eval_of_a_preference_run_reports_its_own_held_out_figures(tmp_path, real_model, stage):  # noqa: F811
    assert_as_trained(train(tmp_path, stage), FIGURES["pref"])
