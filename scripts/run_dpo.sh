#!/usr/bin/env bash
# DPO with LoRA on Qwen, using the preset for this machine (or HARDWARE=<profile>).
# Knobs: the environment variables here and in train_knobs.sh; extra key=value words pass through.
set -euo pipefail

DATA="${DATA:-demo_pref}"                       # preference dataset(s) in $DATASET_DIR/dataset_info.json
EVAL_DATA="${EVAL_DATA:-demo_pref_eval}"
RUN_NAME="${RUN_NAME:-dpo-qwen}"
BETA="${BETA:-}"                                # pref_beta
source "$(dirname "$0")/train_knobs.sh"

mpskit train stage=dpo "${TRAIN_ARGS[@]}" ${BETA:+pref_beta=$BETA} "$@"
