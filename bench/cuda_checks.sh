#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, run side by side (the memory figures are the device's own
# counters, per process, so the two do not disturb each other's):
#   - exactness: tests/test_qlora.py on the GPU: every stage in 4 and 8 bits logs the losses of plain
#     llamafactory-cli on the YAML mpskit wrote; the records' devices are listed, so a run that fell
#     back to the CPU shows;
#   - memory: bench/memory_accuracy.py's quantized cases on this machine's profile, estimate against
#     torch.cuda.max_memory_allocated.
# Needs mpskit's dependencies installed (make install). Writes its logs and JSON to $CHECKS_DIR.
#
#   bash bench/cuda_checks.sh
set -euo pipefail
CHECKS_DIR=${CHECKS_DIR:-output/cuda-checks}
WORKERS=${WORKERS:-8}
REPEATS=${REPEATS:-1}
PYTHON=${PYTHON:-python3}

"$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device here')"
mkdir -p "$CHECKS_DIR"
"$PYTHON" -m mpskit.cli detect > "$CHECKS_DIR/detect.txt" 2>&1 || true

"$PYTHON" -m pytest -q -p no:cacheprovider -n "$WORKERS" --basetemp="$CHECKS_DIR/pytest" tests/test_qlora.py \
  > "$CHECKS_DIR/exactness.log" 2>&1 &
exactness=$!
"$PYTHON" bench/memory_accuracy.py --quantized --hardware detect --repeats "$REPEATS" --out "$CHECKS_DIR/memory.json" \
  > "$CHECKS_DIR/memory.log" 2>&1 &
memory=$!

status=0
wait "$exactness" || status=1
wait "$memory" || status=1
tail -n 20 "$CHECKS_DIR/exactness.log"
echo "devices the exactness runs trained on:"
find "$CHECKS_DIR/pytest" -name mpskit.json -exec "$PYTHON" -c \
  'import json, sys; [print(json.load(open(p))["device"]) for p in sys.argv[1:]]' {} + | sort | uniq -c
cat "$CHECKS_DIR/memory.log"
exit "$status"
