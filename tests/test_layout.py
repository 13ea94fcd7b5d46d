"""The package's rooms and the import rules their docstrings state: each module imports only from its
own floor and the floors below it (function-level imports included), and no module is left outside a
room but the shared ones at the bottom and the command line on top."""

import ast
import importlib

from conftest import ROOT

# Floors, bottom first: a module may import any mpskit module on its own floor or below.
FLOORS = [
    {"mpskit", "mpskit.errors", "mpskit.stages", "mpskit.rundir", "mpskit.temporary"},
    {"mpskit.inputs"},
    {"mpskit.plan"},
    {"mpskit.engine"},
    {"mpskit.run"},
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
