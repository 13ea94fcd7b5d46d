"""Bad inputs end with one line naming the problem and the fix, exit code 2, no traceback."""

import pytest
from conftest import ROOT, run_mpskit


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and "warning" not in line]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mpskit: error:") and "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unknown_key_suggests_the_closest(tiny_model):
    result = run_mpskit("config", "preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", "lora_rnak=4")
    assert_one_line_error(result, "unknown key 'lora_rnak'", "did you mean 'lora_rank'")


def test_missing_model_path_names_model_path_and_demo(tmp_path):
    result = run_mpskit("config", "preset=sft", f"model_name_or_path={tmp_path / 'nope'}")
    assert_one_line_error(result, "MODEL_PATH", "make demo")


def test_unreachable_hub_id_names_model_path_and_demo():
    result = run_mpskit("train", "preset=sft", "model_preset=qwen1.5-0.5b")
    assert_one_line_error(result, "Qwen/Qwen1.5-0.5B", "MODEL_PATH", "make demo")


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("stage: sft\n  lora_rank: [4\n")
    result = run_mpskit("config", str(bad))
    assert_one_line_error(result, "not valid YAML", "line")


def test_dataset_missing_from_dataset_info(tiny_model):
    result = run_mpskit("config", "preset=sft", f"model_name_or_path={tiny_model}", "dataset=nope")
    assert_one_line_error(result, "dataset 'nope'", "dataset_info.json", "demo_sft")


@pytest.mark.parametrize(
    ("words", "needle"),
    [
        (["preset=sft", "model_preset=tiny", "--hardware", "m9-ultra"], "unknown hardware preset"),
        (["preset=nonsense", "model_preset=tiny"], "unknown stages preset"),
        (["preset=sft", "model_preset=qwen9"], "unknown models preset"),
        (["model_preset=tiny"], "no stage given"),
    ],
)
def test_unknown_presets(words, needle):
    assert_one_line_error(run_mpskit("config", *words), needle)


def test_train_refuses_an_existing_output_dir_and_leaves_it_alone(tiny_model, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("two hours of training")
    result = run_mpskit("train", "preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", f"output_dir={out}")
    assert_one_line_error(result, "already holds files")
    assert (out / "keep.txt").read_text() == "two hours of training" and len(list(out.iterdir())) == 1


def test_help_is_fast_and_clean():
    result = run_mpskit("--help")
    assert result.returncode == 0 and "train" in result.stdout
    assert "rank" not in result.stdout  # the command torchrun starts is not the user's


def test_version():
    from mpskit import __version__

    result = run_mpskit("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"mpskit {__version__}"


def test_config_writes_a_file(tiny_model, tmp_path):
    out = tmp_path / "lf.yaml"
    result = run_mpskit("config", "preset=dpo", f"model_name_or_path={tiny_model}", "template=qwen", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "stage: dpo" in out.read_text()
    assert ROOT.as_posix() in out.read_text()  # dataset_dir made absolute
    words = ["config", "preset=sft", f"model_name_or_path={tiny_model}", "template=qwen", "-o", str(out)]
    assert run_mpskit(*words).returncode == 2 and "stage: dpo" in out.read_text()  # never replaced unasked
    assert run_mpskit(*words, "--force").returncode == 0 and "stage: sft" in out.read_text()


def test_config_for_a_hub_model_needs_no_download(tmp_path):
    out = tmp_path / "dpo.yaml"
    data = f"dataset_dir={ROOT / 'data'}"
    result = run_mpskit("config", "preset=dpo", "model_preset=qwen2.5-0.5b", data, "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        "Qwen/Qwen2.5-0.5B is not downloaded" in result.stderr
        and "model_name_or_path: Qwen/Qwen2.5-0.5B" in out.read_text()
    )
    refused = run_mpskit("train", "preset=dpo", "model_preset=qwen2.5-0.5b", data, cwd=tmp_path)  # train still checks
    assert refused.returncode == 2 and "MODEL_PATH" in refused.stderr
