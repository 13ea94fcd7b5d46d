"""What the tests share: the warm runner for mpskit and llamafactory-cli commands, one tiny model per
session, and the patterns of mpskit's screen lines. Under pytest-xdist (`make test`), modules whose
tests share a module-scoped run carry `xdist_group(__name__)`, so one worker runs them all."""

import ast
import contextlib
import functools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
# The tests' own faults (plugins/faults.py): in this process, and through sitecustomize.py in every
# interpreter the tests start.
PLUGINS = Path(__file__).resolve().parent / "plugins"
sys.path.insert(0, str(PLUGINS))
os.environ["PYTHONPATH"] = os.pathsep.join([str(PLUGINS), *filter(None, [os.environ.get("PYTHONPATH")])])
import faults  # noqa: E402, F401 - installs itself
import warm  # noqa: E402

# Nothing in the tests may reach a model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
# A detected machine plans with the profiles' figures, never with a calibration this machine keeps.
os.environ["MPSKIT_CALIBRATION_FILE"] = str(Path(__file__).resolve().parent / "data" / "no-calibration.json")
# Several pytest-xdist workers share the cores: torch's threads in each of them (OpenMP spins while it
# waits) would slow every run several times over. Each worker's runs get its share of the cores.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))
TIMEOUT_S = 600
# How a run's summary gives its duration: "12.3 s", or "1 min 13 s" past a minute.
DURATION = r"(?:\d+ min \d+ s|\d+(?:\.\d+)? s)"


# What `make test-fast` (--no-torch) leaves out: test modules that import these as they load, themselves
# or through mpskit's modules or another test module. The unit tests of mpskit's torch code run in `make test`.
TORCH_PACKAGES = ("torch", "transformers", "peft", "trl", "safetensors.torch", "llamafactory", "bitsandbytes")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-torch", action="store_true",
                     help="collect no test module that imports torch as it loads (make test-fast)")  # fmt: skip


def _source_of(name: str) -> Path | None:
    """The file of an mpskit module or of a test module, where NAME is one."""
    base = ROOT / Path(*name.split(".")) if name.split(".")[0] == "mpskit" else ROOT / "tests" / name
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)


@functools.cache
def _imports_torch(module: Path) -> bool:
    """Whether the module imports a TORCH_PACKAGES package at its top level, itself or through mpskit's
    modules or a test module (the package has no circle of imports: test_layout)."""
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            if any(name == package or name.startswith(f"{package}.") for package in TORCH_PACKAGES):
                return True
            source = _source_of(name) if name.split(".")[0] == "mpskit" or name.startswith("test_") else None
            if source is not None and source != module and _imports_torch(source):
                return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("no_torch") and collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return _imports_torch(collection_path) or None
    return None


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.getoption("no_torch") and "torch" in sys.modules:
        raise pytest.UsageError("--no-torch collected a module that imports torch: add its package to TORCH_PACKAGES")


def progress_line(steps: int) -> re.Pattern:
    """mpskit's line for one logging step of a run of `steps` steps; group 1: the step, 2: the memory.
    The learning rate and the rate are left out where the line would pass the terminal's width."""
    return re.compile(
        rf"^mpskit: step (\d+)/{steps} \| loss \d+\.\d{{4}}(?: \| lr \d\.\d\de[-+]\d\d)?(?: \| [\d,]+ tok/s)?"
        r" \| mem (\d+\.\d\d) GB \(plan \d+\.\d\d\) \| ETA (?:\d+:)?\d+:\d\d$"
    )


def run_mpskit(*words: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m mpskit.cli WORDS` in a warm child (tests/warm.py). Tests about the process itself
    (signals, kills, a terminal, what it imports) start their own interpreter with subprocess."""
    return warm.run("mpskit.cli", list(words), cwd, {**os.environ, **(env or {})}, TIMEOUT_S)


def run_llamafactory_cli(*words: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Plain `llamafactory-cli WORDS` (LLaMA-Factory's own entry point, nothing of mpskit's), in a warm child."""
    return warm.run("llamafactory.cli", list(words), cwd, {**os.environ, **(env or {})}, TIMEOUT_S)


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder this test session shares between its workers (pytest-xdist's), or its own without them."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The demo's tiny model, built once per test session (the first worker to ask builds it)."""
    folder = shared_folder(tmp_path_factory)
    model = folder / "tiny" / "model"
    with FileLock(folder / "tiny.lock"):
        if not (model / "config.json").is_file():
            built = run_mpskit("tiny-model", str(model), "--data", str(ROOT / "data"))
            assert built.returncode == 0, built.stderr
    return model


@contextlib.contextmanager
def tmpfs(folder: Path, size: str, without: str = "") -> Iterator[Path]:
    """A real file system of SIZE (tmpfs) at FOLDER, where this machine lets a test mount one (as root);
    else the test is skipped, saying WITHOUT: what covers it there."""
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip(f"mounting a tmpfs needs root{without}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
