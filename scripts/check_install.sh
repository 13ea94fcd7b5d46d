#!/usr/bin/env bash
# CI: a plain (not editable) `pip install .` into a new virtual environment, then mpskit run from a
# folder outside the repository: presets and demo data must come from the installed package.
# The dependencies are not installed a second time (torch alone is several GB, more than a CI disk
# may have left): the new venv sees DEPS_VENV's site-packages, the versions `make install` resolved
# from the same pyproject.toml and constraints.txt, and `pip check` proves they satisfy the package.
# Knobs: PYTHON (python3), DEPS_VENV (.venv), WORK (a new temporary folder, removed afterwards).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
DEPS_VENV="${DEPS_VENV:-.venv}"
repo="$(pwd)"
if [ -z "${WORK:-}" ]; then
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
fi

site_packages() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
deps_site="$(site_packages "$DEPS_VENV")"
"$PYTHON" -m venv "$WORK/venv"
venv_site="$(site_packages "$WORK/venv")"
"$WORK/venv/bin/pip" uninstall --quiet --yes setuptools  # venv's own old copy would shadow DEPS_VENV's
echo "$deps_site" > "$venv_site/mpskit-check-deps.pth"
"$WORK/venv/bin/pip" install --quiet --no-deps "$repo"
"$WORK/venv/bin/pip" check
cd "$WORK"
mpskit="$WORK/venv/bin/mpskit"
"$mpskit" --version
"$WORK/venv/bin/python" -c 'import mpskit, sys; sys.exit(0 if mpskit.__file__.startswith(sys.argv[1]) else f"mpskit imported from {mpskit.__file__}")' "$venv_site"
"$mpskit" ls | grep "qwen2.5-0.5b"
"$mpskit" plan stage=sft model_preset=qwen2.5-0.5b --hardware m1-pro-16gb
"$mpskit" config stage=dpo model_preset=tiny --hardware cpu | grep "dataset_dir: $WORK/venv/lib/"
echo "mpskit: the installed package plans and writes runs from $WORK"
