#!/usr/bin/env bash
# CI: a plain (not editable) `pip install .` into a new virtual environment, then mpskit run from a
# folder outside the repository: presets and demo data must come from the installed package.
# Knobs: PYTHON (python3), WORK (a new temporary folder).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
WORK="${WORK:-$(mktemp -d)}"
repo="$(pwd)"

"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet -c "$repo/constraints.txt" "$repo"
cd "$WORK"
mpskit="$WORK/venv/bin/mpskit"
"$mpskit" --version
"$mpskit" ls | grep "qwen2.5-0.5b"
"$mpskit" plan stage=sft model_preset=qwen2.5-0.5b --hardware m1-pro-16gb
"$mpskit" config stage=dpo model_preset=tiny --hardware cpu | grep "dataset_dir: $WORK/venv/lib/"
echo "mpskit: the installed package plans and writes runs from $WORK"
