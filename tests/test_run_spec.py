"""RunSpec: one split of the mixed arguments, two translations, and the same value rebuilt from a run folder."""

import pytest
import yaml

from mpskit.errors import MpskitError
from mpskit.rundir.folder import RunDir, args_text
from mpskit.rundir.record import RunRecord
from mpskit.settings.foodpo import FooDPOConfig
from mpskit.settings.knobs import OwnKnobs
from mpskit.settings.run_spec import RunSpec

FOODPO_RUN = {"stage": "foodpo", "model_name_or_path": "m", "pref_beta": 0.1, "pref_beta_scale": 0.05,
              "foodpo_beta_max": 1, "lean_logits": False, "lean_attention": True}  # fmt: skip


def test_the_mixed_arguments_split_once_into_typed_settings():
    spec = RunSpec.of(FOODPO_RUN)
    assert spec.lean == OwnKnobs(lean_logits=False, lean_attention=True)
    assert spec.foodpo == FooDPOConfig(pref_beta_scale=0.05, beta_max=1.0)
    assert "lean_logits" not in spec.args and spec.args["pref_beta_scale"] == 0.05
    with pytest.raises(TypeError):
        spec.args["cutoff_len"] = 8  # frozen, its arguments too


def test_run_exp_gets_dpo_without_foodpos_keys_and_the_folder_keeps_the_foodpo_stage():
    spec = RunSpec.of(FOODPO_RUN)
    assert spec.engine_args() == {"stage": "dpo", "model_name_or_path": "m", "pref_beta": 0.1}
    assert spec.yaml_args() == {key: value for key, value in FOODPO_RUN.items() if not key.startswith("lean_")}
    assert spec.record_args() == {"lean_logits": False, "lean_attention": True, "quantize_embeddings": None}
    sft = RunSpec.of({"stage": "sft", "model_name_or_path": "m"})
    assert sft.foodpo is None and sft.engine_args() == {"stage": "sft", "model_name_or_path": "m"}
    assert sft.record_args() == {"lean_logits": True, "lean_attention": None, "quantize_embeddings": None}  # all


def test_a_run_folder_rebuilds_the_same_spec(tmp_path):
    spec = RunSpec.of(FOODPO_RUN)
    record = RunRecord(run_name="r", stage="foodpo", device="cpu", mpskit_args=spec.record_args())
    run = RunDir.create(tmp_path / "run", record, args_text({**spec.yaml_args(), "output_dir": "elsewhere"}))
    again = RunDir.open(run.path)
    assert yaml.safe_load((run.path / "llamafactory.yaml").read_text())["stage"] == "foodpo"
    rebuilt = RunSpec.of(again.train_args())
    assert rebuilt.lean == spec.lean and rebuilt.foodpo == spec.foodpo
    assert rebuilt.args == {**spec.args, "output_dir": str(run.path)}  # trains where the folder now is


def test_bad_foodpo_settings_are_one_error_when_the_spec_is_made():
    with pytest.raises(MpskitError, match="foodpo_beta_min is above foodpo_beta_max"):
        RunSpec.of({**FOODPO_RUN, "foodpo_beta_min": 2})
