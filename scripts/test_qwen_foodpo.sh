#!/usr/bin/env bash
# fooDPO (DPO with a perplexity-scaled beta) with LoRA on Qwen, using the preset for this machine.
# Knobs: the environment variables in train_knobs.sh (BETA_SCALE among them); extra key=value words
# pass through.
set -euo pipefail

if [[ -z "${DATA:-}" ]]; then                 # the demo data and its held-out set (your DATA: as mpskit train)
    DATA=demo_pref EVAL_DATA="${EVAL_DATA:-demo_pref_eval}"
fi
RUN_NAME="${RUN_NAME:-foodpo-qwen}"
source "$(dirname "$0")/train_knobs.sh"

mpskit train stage=foodpo "${TRAIN_ARGS[@]}" "$@"
