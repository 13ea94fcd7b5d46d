"""Refuse, in one line, a machine where mpskit's dependencies cannot install: run by `make install`
before anything is made. Standard library only, so any python3 runs it (macOS ships 3.9).

MPSKIT_PLATFORM="SYSTEM MACHINE MACOS_VERSION PYTHON_VERSION" fakes the machine (tests).
"""

import os
import platform
import sys

OLDEST_PYTHON = (3, 11)  # pyproject.toml's requires-python
# PyPI's torch has no Intel-Mac wheel newer than 2.2.2, and LLaMA-Factory 0.9.5 needs torch >= 2.4.
# On Apple silicon, PyTorch's MPS backend needs macOS 12.3 (torch 2.12+ needs 14; pip then takes 2.11).
OLDEST_MACOS = (12, 3)


def version(text):
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def refusal(system, machine, macos, python):
    """The one line that says why this machine cannot install mpskit, or None."""
    if version(python) < OLDEST_PYTHON:
        return (
            f"Python {python} is older than {'.'.join(map(str, OLDEST_PYTHON))}; install a newer one "
            "(macOS: brew install python@3.11) and run: make install PYTHON=python3.11"
        )
    if system == "Darwin" and machine != "arm64":
        return (
            "an Intel Mac: PyPI's torch stops at 2.2.2 there and LLaMA-Factory 0.9.5 needs 2.4 or newer; "
            "train on an Apple-silicon Mac, a Linux machine, or a rented CUDA machine instead"
        )
    if system == "Darwin" and version(macos) < OLDEST_MACOS:
        return (
            f"macOS {macos} is older than 12.3, the first with PyTorch's MPS backend; "
            "update macOS (14 or newer gets the torch version mpskit is tested with)"
        )
    return None


def main():
    fake = os.environ.get("MPSKIT_PLATFORM", "").split()
    if fake:
        system, machine, macos, python = fake
    else:
        system, machine = platform.system(), platform.machine()
        macos, python = platform.mac_ver()[0], platform.python_version()
    why = refusal(system, machine, macos, python)
    if why:
        print(f"mpskit: cannot install on this machine: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
