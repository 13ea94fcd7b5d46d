"""The package's rooms and the import rules their docstrings state: each module imports only from its
own floor and the floors below it (function-level imports included), torch and the libraries that load
it only at module level where the room's docstring names the module, and no module is left outside a
room but the shared ones at the bottom and the command line on top. The tests' own fault switches live
in the tests."""

import ast
import importlib
import re

from conftest import ROOT

# Floors, bottom first: a module may import any mpskit module on its own floor or below.
FLOORS = [
    {"mpskit", "mpskit.errors", "mpskit.stages", "mpskit.rundir", "mpskit.temporary", "mpskit.lock_files",
     "mpskit.output_folder", "mpskit.self_command", "mpskit.presets", "mpskit.files", "mpskit.collector"},
    {"mpskit.export"},
    {"mpskit.machine"},
    {"mpskit.datasets"},
    {"mpskit.settings"},
    {"mpskit.plan"},
    {"mpskit.engine"},
    {"mpskit.run"},
    {"mpskit.trials"},
    {"mpskit.recipes"},
    {"mpskit.tools"},
    {"mpskit.cli"},
]


def room(module: str) -> str:
    """mpskit.plan.memory -> mpskit.plan; mpskit.errors -> mpskit.errors; mpskit -> mpskit."""
    parts = module.split(".")
    return ".".join(parts[:2])


def floor(module: str) -> int | None:
    return next((level for level, rooms in enumerate(FLOORS) if room(module) in rooms), None)


def modules() -> dict[str, ast.Module]:
    package = ROOT / "mpskit"
    found = {}
    for path in sorted(package.rglob("*.py")):
        if path.parent.name in ("data", "configs"):  # shipped files (the demo data's generator), not code
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(encoding="utf-8"))
    return found


def imported(tree: ast.Module, known: set[str]) -> set[str]:
    """The mpskit modules a module imports: `from mpskit.plan import memory` names mpskit.plan.memory."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mpskit":
            full = {f"{node.module}.{alias.name}" for alias in node.names}
            names |= {name if name in known else node.module for name in full}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.split(".")[0] == "mpskit"}
    return names


def test_every_module_lives_in_a_room():
    assert [name for name in modules() if floor(name) is None] == []


def test_no_module_imports_from_a_floor_above_its_own():
    found = modules()
    broken = [
        f"{name} imports {target}"
        for name, tree in found.items()
        for target in imported(tree, set(found))
        if floor(target) is None or floor(target) > floor(name)  # None: no such room
    ]
    assert broken == []


def test_each_room_says_what_it_owns_and_may_import():
    for rooms in FLOORS[1:-1]:
        for name in rooms:
            docstring = importlib.import_module(name).__doc__ or ""
            assert "May import:" in docstring, name


# Importing any of these loads torch.
TORCH_LOADERS = {"torch", "transformers", "peft", "trl", "llamafactory", "accelerate", "bitsandbytes"}


def loads_torch_at_module_level(tree: ast.Module) -> bool:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return bool(names & TORCH_LOADERS)


def test_torch_loads_at_module_level_only_where_the_room_says():
    """Each room's docstring has a `Torch:` line: "none at module level", "at module level" (any of its
    modules) or "at module level in A, B and C" (those modules only). The command line and the shared
    modules at the bottom load none."""
    found = modules()
    allowed, named = {}, {}
    for rooms in FLOORS[1:-1]:
        for name in rooms:
            docstring = importlib.import_module(name).__doc__ or ""
            [line] = [line for line in docstring.split("\n\n") if line.startswith("Torch:")]
            line = " ".join(line.split())
            if line.startswith("Torch: none at module level"):
                allowed[name] = set()
            elif match := re.match(r"Torch: at module level in (.+?) \(", line):
                named[name] = allowed[name] = {f"{name}.{module}" for module in re.split(r", | and ", match[1])}
            else:
                assert line.startswith("Torch: at module level"), (name, line)
                allowed[name] = {module for module in found if room(module) == name}
    loading = {name for name, tree in found.items() if loads_torch_at_module_level(tree)}
    assert loading - set().union(*allowed.values()) == set()
    assert set().union(*named.values()) - loading == set()  # a docstring that names a module is right about it


def test_nothing_in_the_package_reads_the_tests_fault_switches():
    switches = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "mpskit").rglob("*.py")
        if "MPSKIT_FAKE_" in path.read_text(encoding="utf-8")
    ]
    assert switches == []


def _keys_named(tree: ast.AST, keys: set[str], dict_keys: bool) -> list[ast.Constant]:
    """The constants among `keys` that index a mapping (a subscript, .get/.pop/.setdefault) or, with
    dict_keys, key a dict literal."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            found.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            found += [node.args[0]] if node.func.attr in ("get", "pop", "setdefault") else []
        elif dict_keys and isinstance(node, ast.Dict):
            found += [key for key in node.keys if key is not None]
    return [key for key in found if isinstance(key, ast.Constant) and key.value in keys]


def test_mpskits_own_settings_are_read_by_name_only_in_their_homes():
    """mpskit's own settings are read or written by key only where they are defined and checked.

    - lean_logits, lean_attention (knobs.OwnKnobs), the RunSettings fields and fooDPO's keys
      (foodpo.FooDPOConfig): a subscript, .get/.pop/.setdefault or a dict literal's key, only in knobs,
      run_settings, foodpo, run_spec, validate's ranges and the record's own reading (rundir.record);
    - the choices that pick layers or a file (preset, model_preset, hardware, device, zero): read only in
      resolve, which pops them from the user's keys (a dict literal elsewhere is an output's field name).
    Everywhere else they are fields of a typed value."""
    import dataclasses

    from mpskit.settings.foodpo import FOODPO_KEYS
    from mpskit.settings.knobs import OWN_KEYS
    from mpskit.settings.resolve import MPSKIT_KEYS
    from mpskit.settings.run_settings import RunSettings

    settings = set(OWN_KEYS) | {item.name for item in dataclasses.fields(RunSettings)} | set(FOODPO_KEYS)
    choices = set(MPSKIT_KEYS) - settings - {"run_name"}  # run_name is transformers' too
    assert choices == {"preset", "model_preset", "hardware", "device", "zero"}
    homes = {f"mpskit.settings.{name}" for name in ("knobs", "run_settings", "foodpo", "run_spec", "validate")}
    homes.add("mpskit.rundir.record")
    named = []
    for name, tree in modules().items():
        if name not in homes:
            named += [f"{name}:{key.lineno} {key.value}" for key in _keys_named(tree, settings, dict_keys=True)]
        if name != "mpskit.settings.resolve":
            named += [f"{name}:{key.lineno} {key.value}" for key in _keys_named(tree, choices, dict_keys=False)]
    assert named == []


def test_no_modules_import_each_other():
    """Imports run one way: no circle of modules, lazy imports inside functions counted too."""
    found = modules()
    graph = {name: imported(tree, set(found)) & set(found) - {name} for name, tree in found.items()}
    circles, done = [], set()

    def walk(name: str, path: list[str]) -> None:
        for other in sorted(graph[name]):
            if other in path:
                circles.append(" -> ".join([*path[path.index(other) :], other]))
            elif other not in done:
                walk(other, [*path, other])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            walk(name, [name])
    assert circles == []


def test_the_layout_page_names_every_module():
    """docs/layout.md is where a newcomer finds a module: each one in the package is named there."""
    page = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    modules = sorted(path for path in (ROOT / "mpskit").rglob("*.py") if path.name != "__init__.py")
    assert modules and [p.relative_to(ROOT) for p in modules if not re.search(rf"\b{re.escape(p.name)}\b", page)] == []
