#!/usr/bin/env bash
# `make install`: a virtual environment with mpskit and the dependency versions it is tested with.
# Knobs: PYTHON (python3), VENV (.venv), EXTRAS (test), TORCH_INDEX (auto: PyTorch's CPU-only build on
# a Linux machine without nvidia-smi, else PyPI's torch; give an index URL, or "pypi").
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-test}"
TORCH_INDEX="${TORCH_INDEX:-auto}"
CPU_INDEX="https://download.pytorch.org/whl/cpu"

"$PYTHON" scripts/check_platform.py  # one line and exit 1 where torch or LLaMA-Factory cannot install
if [ "$TORCH_INDEX" = auto ]; then
  TORCH_INDEX=pypi
  if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null; then TORCH_INDEX="$CPU_INDEX"; fi
fi

"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/pip" install --quiet -c constraints.txt)
"$VENV/bin/pip" install --quiet --upgrade pip
if [ "$TORCH_INDEX" != pypi ]; then
  "${pip[@]}" --retries 1 --timeout 30 --extra-index-url "$TORCH_INDEX" torch torchvision \
    || echo "mpskit: no torch from $TORCH_INDEX; PyPI's comes instead (CUDA libraries included)" >&2
fi
"${pip[@]}" -e ".[$EXTRAS]"
