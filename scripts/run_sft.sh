#!/usr/bin/env bash
# SFT with LoRA on Qwen, using the preset for this machine (or HARDWARE=<profile>).
# Knobs: the environment variables in train_knobs.sh; extra key=value words pass through.
set -euo pipefail

if [[ -z "${DATA:-}" ]]; then                 # the demo data and its held-out set (your DATA: as mpskit train)
    DATA=demo_sft EVAL_DATA="${EVAL_DATA:-demo_sft_eval}"
fi
RUN_NAME="${RUN_NAME:-sft-qwen}"
source "$(dirname "$0")/train_knobs.sh"

mpskit train stage=sft "${TRAIN_ARGS[@]}" "$@"
