"""`make install` refuses, in one line and before making anything, machines it cannot install on; the
versions CI tests lie inside the ranges the package declares."""

import os
import subprocess
import tomllib

import pytest
from conftest import ROOT
from packaging.markers import default_environment
from packaging.requirements import Requirement


@pytest.mark.parametrize(
    "fake, needle",
    [
        ("Darwin x86_64 14.2 3.11.9", "an Intel Mac"),
        ("Darwin x86_64 10.15.7 3.11.9", "an Intel Mac"),
        ("Darwin arm64 12.1 3.11.9", "macOS 12.1 is older than 12.3"),
        ("Darwin arm64 11.7.10 3.12.0", "macOS 11.7.10 is older than 12.3"),
        ("Darwin arm64 14.5 3.9.6", "Python 3.9.6 is older than 3.11"),
        ("Linux x86_64 - 3.10.12", "Python 3.10.12 is older than 3.11"),
    ],
)
def test_install_refuses_in_one_line_before_making_anything(tmp_path, fake, needle):
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["bash", "scripts/install.sh"],
        cwd=ROOT,
        env={**os.environ, "MPSKIT_PLATFORM": fake, "VENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpskit: cannot install on this machine: ") and needle in lines[0]
    assert not venv.exists()


@pytest.mark.parametrize("fake", ["Darwin arm64 14.5 3.11.9", "Darwin arm64 13.6.1 3.12.1", "Linux aarch64 - 3.11.4"])
def test_supported_machines_pass_the_check(fake):
    result = subprocess.run(
        ["python3", "scripts/check_platform.py"], cwd=ROOT, env={**os.environ, "MPSKIT_PLATFORM": fake}, timeout=60
    )
    assert result.returncode == 0


def test_tested_versions_lie_in_the_declared_ranges():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    tested = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pin = Requirement(line)
            if pin.marker is None or pin.marker.evaluate(default_environment()):
                tested[pin.name.lower()] = next(iter(pin.specifier)).version
    for requirement in map(Requirement, declared):
        assert requirement.specifier.contains(tested[requirement.name.lower()]), requirement


def test_the_package_list_names_every_package_of_the_code():
    """setuptools takes only the packages pyproject.toml lists: a room left out installs without it
    (make check-install finds it minutes later)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    code = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "mpskit").rglob("__init__.py")}
    assert code - listed == set()
