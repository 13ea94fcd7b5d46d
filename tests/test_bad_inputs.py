"""Every bad input: exit code 2, one line naming the problem and the fix, no traceback, and nothing
that was there before is changed. Plus fuzzing of the config loader and merger (hypothesis)."""

import hashlib
import json
from pathlib import Path

import pytest
from conftest import ROOT, run_mpskit
from hypothesis import given, settings
from hypothesis import strategies as st

from mpskit.errors import MpskitError
from mpskit.memory import GB
from mpskit.presets import load_yaml, merge, parse_overrides
from mpskit.resolve import PLANNER_KEYS, resolve
from mpskit.validate import CHOICES, RANGES, SWITCHES

DATA = ROOT / "data"


def make_files(work: Path, model: Path) -> dict[str, Path]:
    """Inputs the cases point at, written before the snapshot."""
    files = {}

    def write(name: str, text: str | bytes) -> Path:
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        files[name] = path
        return path

    write("broken.yaml", "stage: sft\n  lora_rank: [4\n")
    write("list.yaml", "- stage\n- sft\n")
    write("latin1.yaml", b"stage: sft\nrun_name: caf\xe9\n")
    (work / "folder.yaml").mkdir()
    write("hw_unknown_key.yaml", "kind: cpu\nchip: x\nram_gb: 8\ngpus: 2\n")
    write("hw_negative_ram.yaml", "kind: cpu\nchip: x\nram_gb: -8\n")
    write("no_config_model/weights.bin", "")
    write("no_info/demo.json", "[]")
    write("bad_info/dataset_info.json", "{not json")
    write("missing_file/dataset_info.json", json.dumps({"d": {"file_name": "gone.json"}}))
    write("a_file", "not a folder")
    write("full_run/keep.txt", "two hours of training")
    write("no_ckpt_run/mpskit.json", "{}")
    write("no_ckpt_run/llamafactory.yaml", "stage: sft\n")
    (work / "not_a_run").mkdir()
    return files


def base(model: Path) -> list[str]:
    return ["stage=sft", f"model_name_or_path={model}", f"dataset_dir={DATA}", "template=qwen"]


# (case id, words after `mpskit`, needles in the one error line); {w} is the work dir, {m} the model
CASES = [
    ("run file missing", ["train", "{w}/nope.yaml"], ["does not exist"]),
    ("run file malformed", ["train", "{w}/broken.yaml"], ["not valid YAML", "line"]),
    ("run file is a list", ["train", "{w}/list.yaml"], ["not a mapping"]),
    ("run file not UTF-8", ["train", "{w}/latin1.yaml"], ["cannot read"]),
    ("run file is a folder", ["train", "{w}/folder.yaml"], ["cannot read"]),
    ("unknown key", ["train", "BASE", "lora_rnak=4"], ["unknown key 'lora_rnak'", "lora_rank"]),
    ("no stage", ["train", "model_preset=tiny"], ["no stage given"]),
    ("unknown stage", ["train", "stage=ppo2", "model_preset=tiny"], ["unknown stages preset"]),
    ("unknown model preset", ["train", "stage=sft", "model_preset=qwen9"], ["unknown models preset"]),
    ("unknown hardware", ["train", "BASE", "--hardware", "m9-ultra"], ["unknown hardware preset"]),
    ("hardware key unknown", ["train", "BASE", "--hardware", "{w}/hw_unknown_key.yaml"], ["unknown key(s) gpus"]),
    ("hardware RAM negative", ["train", "BASE", "--hardware", "{w}/hw_negative_ram.yaml"], ["ram_gb -8"]),
    ("--hardware without value", ["train", "BASE", "--hardware"], ["--hardware needs a value"]),
    ("model missing", ["train", "stage=sft", "model_name_or_path={w}/nope"], ["MODEL_PATH", "make demo"]),
    ("model without config", ["train", "stage=sft", "model_name_or_path={w}/no_config_model"], ["config.json"]),
    ("hub id offline", ["train", "stage=sft", "model_preset=qwen2.5-0.5b"], ["Qwen/Qwen2.5-0.5B", "MODEL_PATH"]),
    ("dataset not listed", ["train", "BASE", "dataset=nope"], ["dataset 'nope'", "demo_sft"]),
    ("no dataset_info.json", ["train", "BASE", "dataset_dir={w}/no_info"], ["dataset_info.json not found"]),
    ("dataset_info.json broken", ["train", "BASE", "dataset_dir={w}/bad_info", "dataset=d"], ["not valid JSON"]),
    (
        "dataset file missing",
        ["train", "BASE", "dataset_dir={w}/missing_file", "dataset=d", "eval_dataset="],
        ["gone.json"],
    ),  # fmt: skip
    ("batch zero", ["train", "BASE", "per_device_train_batch_size=0"], ["per_device_train_batch_size=0"]),
    ("batch fractional", ["train", "BASE", "per_device_train_batch_size=2.5"], ["whole number"]),
    ("cutoff text", ["train", "BASE", "cutoff_len=long"], ["cutoff_len='long'"]),
    ("negative learning rate", ["train", "BASE", "learning_rate=-1e-4"], ["learning_rate"]),
    ("dropout above one", ["train", "BASE", "lora_dropout=1.5"], ["lora_dropout"]),
    ("switch not boolean", ["train", "BASE", "bf16=yes"], ["bf16='yes' is not true or false"]),
    ("fp16 and bf16", ["train", "BASE", "fp16=true", "bf16=true"], ["both fp16 and bf16"]),
    ("fp16 on the CPU", ["train", "BASE", "fp16=true"], ["fp16 training is not supported on CPU"]),
    ("attention unknown", ["train", "BASE", "flash_attn=turbo"], ["flash_attn='turbo'"]),
    ("auto on a non-knob", ["train", "BASE", "learning_rate=auto"], ["not a planner knob"]),
    ("device unknown", ["train", "BASE", "device=tpu"], ["device 'tpu'"]),
    ("device not on hardware", ["train", "BASE", "device=mps", "--hardware", "cpu"], ["hardware 'cpu' is cpu"]),
    ("budget zero", ["train", "BASE", "memory_budget_gb=0"], ["memory_budget_gb=0"]),
    ("impossible budget", ["train", "BASE", "memory_budget_gb=0.001"], ["no setting fits"]),
    ("cutoff floor negative", ["train", "BASE", "min_cutoff_len=-5"], ["min_cutoff_len=-5"]),
    (
        "fooDPO negative scale",
        ["train", "BASE", "stage=foodpo", "dataset=demo_pref", "eval_dataset=", "pref_beta_scale=-1"],
        ["pref_beta_scale"],
    ),  # fmt: skip
    (
        "fooDPO kto_pair",
        ["train", "BASE", "stage=foodpo", "dataset=demo_pref", "eval_dataset=", "pref_loss=kto_pair"],
        ["kto_pair"],
    ),  # fmt: skip
    ("output_dir holds files", ["train", "BASE", "output_dir={w}/full_run"], ["already holds files"]),
    ("output_dir under a file", ["train", "BASE", "output_dir={w}/a_file/run"], ["cannot create the run directory"]),
    ("resume: not a run", ["train", "--resume", "{w}/not_a_run"], ["not an mpskit run directory"]),
    ("resume: no checkpoint", ["train", "--resume", "{w}/no_ckpt_run"], ["no checkpoint"]),
    ("resume: nothing to resume", ["train", "--resume"], ["no run found"]),
    ("run_name climbs out", ["train", "BASE", "run_name=../x"], ["run_name '../x' would leave output/"]),
    ("run_name absolute", ["train", "BASE", "run_name=/tmp/x"], ["run_name '/tmp/x' would leave output/"]),
    ("run_name with a separator", ["train", "BASE", "run_name=a/b"], ["run_name 'a/b'"]),
    ("run_name hidden", ["config", "BASE", "run_name=.x"], ["run_name '.x'"]),
    (
        "plan without dims",
        ["plan", "stage=sft", "model_name_or_path=some/model", "--hardware", "cpu"],
        ["dimensions of some/model"],
    ),  # fmt: skip
]


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(root.rglob("*"))
    }


def test_the_table_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize(("words", "needles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(words, needles, tmp_path, tiny_model):
    work = tmp_path / "work"
    work.mkdir()
    make_files(work, tiny_model)
    expanded = []
    for word in words:
        expanded += base(tiny_model) if word == "BASE" else [word.replace("{w}", str(work))]
    before = snapshot(work)
    result = run_mpskit(*expanded, cwd=work)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "warning" not in line]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("mpskit: error:"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "; " in lines[0]  # the problem; the fix
    for needle in needles:
        assert needle in lines[0]
    assert snapshot(work) == before


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 5000), st.floats(allow_nan=True), st.text(max_size=12),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)  # fmt: skip
KEYS = st.sampled_from(
    [*RANGES, *SWITCHES, *CHOICES, *PLANNER_KEYS, "device", "run_name", "memory_budget_gb", "min_cutoff_len",
     "model_preset", "stage", "no_cuda", "use_mps_device", "gradient_checkpointing", "lora_target"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_yaml_loader(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "run.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))  # lone surrogates make invalid UTF-8 too
    try:
        assert isinstance(load_yaml(path), dict)
    except MpskitError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=15), max_size=6))
def test_fuzz_command_line_words(words):
    try:
        assert isinstance(parse_overrides(words), dict)
    except MpskitError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=6), st.dictionaries(KEYS, VALUES, max_size=4))
def test_fuzz_merge_and_resolve(user, file_layer):
    layered = merge({"stage": "sft", "model_preset": "tiny"}, file_layer, user)
    try:
        run = resolve(layered, hardware="cpu")
    except MpskitError:
        return
    assert run.args["model_name_or_path"] and run.device == "cpu"


def test_disk_space_is_checked_before_training(tmp_path, monkeypatch):
    from mpskit import checks

    run = resolve({"stage": "sft", "model_preset": "qwen2.5-0.5b", "output_dir": str(tmp_path / "run")}, hardware="cpu")
    checks.check_disk(run)  # this disk has room for a LoRA checkpoint
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10 * 1024**2})())
    with pytest.raises(MpskitError, match="checkpoints need about"):
        checks.check_disk(run)
    full = resolve(
        {**run.args, "stage": "sft", "model_preset": "qwen2.5-0.5b", "finetuning_type": "full"}, hardware="cpu"
    )
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 3 * GB})())
    with pytest.raises(MpskitError, match="free"):  # full fine-tuning checkpoints hold the whole model
        checks.check_disk(full)
