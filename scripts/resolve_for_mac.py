"""Which versions a Mac would install: pip's dry run of pyproject.toml's dependencies for a macOS
platform, run from any machine (needs PyPI). pip's --platform changes the wheel tags only; environment
markers (`platform_system == "Linux"` on torch's CUDA packages) would still be this machine's, so
they are evaluated as on macOS here.

    python scripts/resolve_for_mac.py 13.0 arm64     # prints torch, torchvision, transformers, ... or pip's error
"""

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

RUN_PIP_AS_MAC = """
import sys
from pip._vendor.packaging import markers
mac = dict(markers.default_environment(), sys_platform="darwin", platform_system="Darwin",
           platform_machine=sys.argv.pop(1), platform_release=sys.argv.pop(1))
markers.default_environment = lambda: mac
from pip._internal.cli.main import main
sys.exit(main())
"""
SHOWN = ("torch", "torchvision", "transformers", "peft", "trl", "accelerate", "datasets", "llamafactory")


def main() -> int:
    macos, machine = sys.argv[1], sys.argv[2]
    darwin = f"{int(macos.split('.')[0]) + 9}.0.0"  # macOS 13 is Darwin 22
    dependencies = tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"]
    with tempfile.TemporaryDirectory() as work:
        requirements = Path(work) / "requirements.txt"
        requirements.write_text("\n".join(dependencies))
        platform = f"macosx_{macos.replace('.', '_')}_{machine}"
        result = subprocess.run(
            [sys.executable, "-c", RUN_PIP_AS_MAC, machine, darwin, "install", "--dry-run", "--isolated",
             "--ignore-installed", "--only-binary=:all:", "--python-version", "3.11", "--platform", platform,
             "--target", f"{work}/target", "-r", str(requirements)],
            capture_output=True, text=True,
        )  # fmt: skip
    chosen = [word for line in result.stdout.splitlines() if line.startswith("Would install") for word in line.split()]
    versions = [word for word in chosen if word.rsplit("-", 1)[0].lower() in SHOWN]
    print(f"{platform}: {' '.join(versions) if versions else 'does not resolve'}")
    if not versions:
        print("\n".join(line for line in result.stderr.splitlines() if "ERROR" in line or "depends on" in line))
    return 0 if versions else 1


if __name__ == "__main__":
    sys.exit(main())
