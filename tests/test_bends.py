"""bends.py lists every name mpskit replaces in the libraries it runs on: each was checked on the
installed versions, a training run replaces each and puts it back, and no other module replaces one.
(What each bend does is tested where it matters: test_qlora, test_resume, test_lean_*, test_hide_mps.)"""

import ast

from conftest import ROOT

from mpskit.engine import bends
from mpskit.settings.run_spec import RunSpec

LIBRARIES = {"torch", "transformers", "llamafactory", "bitsandbytes", "peft", "trl", "accelerate", "datasets"}


def test_every_bend_was_checked_on_the_installed_versions():
    assert bends.check() == []
    newer = bends.Bend(("llamafactory.train.tuner:LogCallback",), "llamafactory", "==0.9.4", "a test")
    [line] = bends.check((newer,))
    assert "llamafactory.train.tuner:LogCallback" in line and "llamafactory==0.9.4" in line and "0.9.5" in line


def test_a_training_run_replaces_each_listed_name_and_puts_it_back(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # a rank of a DeepSpeed run on the CPU (machine/launch.py)
    spec = RunSpec.of({"stage": "foodpo", "model_name_or_path": "m", "quantization_bit": 4,
                       "quantize_embeddings": True, "deepspeed": "ds_z3.json"})  # fmt: skip
    # MPS is hidden for good, before torch loads; the trainer is silenced by run/quiet.py (below)
    during = [bend for bend in bends.BENDS if bend not in (bends.NO_ACCELERATOR, bends.SILENT, bends.AS_TRAINED)]
    targets = [target for bend in during for target in bend.targets]
    before = {target: bends.current(target) for target in targets}
    with bends.training_bends(spec) as (lean, attention, engine):
        assert [target for target in targets if bends.current(target) is before[target]] == []
        assert bends.current("llamafactory.train.dpo.trainer:CustomDPOTrainer").func.__name__ == "FooDPOTrainer"
        assert lean.report and attention.report is not None and engine == {}  # filled as training begins
    assert [target for target in targets if bends.current(target) is not before[target]] == []


def test_a_gather_on_the_cpu_runs_to_its_end_before_it_returns():
    """DeepSpeed 0.18.4 waits on the last of several asynchronous gloo gathers only (cpu_gathers.py)."""
    from mpskit.engine.cpu_gathers import to_the_end

    asked = []

    def gather(output, tensor, group=None, async_op=False):
        asked.append(async_op)
        output.append(tensor)
        return "done at once"

    written = []
    handle = to_the_end(gather)(written, 7, group="g", async_op=True)
    assert asked == [False] and written == [7]  # synchronous, whatever the caller asked
    assert handle.wait() is None and handle.is_completed()
    assert to_the_end(gather)(written, 8) == "done at once"


def test_an_evaluation_computes_as_training_did_within_and_not_after():
    from mpskit.engine import lf

    lf.import_engine()
    before = {target: bends.current(target) for target in bends.AS_TRAINED.targets}
    with bends.evaluated_as_trained():
        assert [target for target in before if bends.current(target) is before[target]] == []
    assert [target for target in before if bends.current(target) is not before[target]] == []


def test_the_trainer_is_silent_within_and_speaks_after():
    before = {target: bends.current(target) for target in bends.SILENT.targets}
    with bends.silent_trainer():
        assert [target for target in before if bends.current(target) is before[target]] == []
    assert [target for target in before if bends.current(target) is not before[target]] == []


def _library_names(tree: ast.Module) -> set[str]:
    """The names a module binds to the libraries' modules (import torch; from llamafactory.train import tuner)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in LIBRARIES}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            names |= {a.asname or a.name for a in node.names if a.name[:1].islower()}  # modules, not classes
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_no_other_module_replaces_a_name_in_a_library():
    found = []
    for path in sorted((ROOT / "mpskit").rglob("*.py")):
        if path.name == "bends.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        libraries = _library_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                named = [item for target in node.targets for item in getattr(target, "elts", [target])]  # a, b = ...
                replaced = [target for target in named if isinstance(target, ast.Attribute)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
                replaced = node.args[:1]
            else:
                continue
            found += [f"{path.name}:{node.lineno}" for target in replaced if _root(target) in libraries]
    assert found == []
