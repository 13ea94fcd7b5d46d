#!/usr/bin/env bash
# fooDPO (DPO with a perplexity-scaled beta) with LoRA on Qwen, using the preset for this machine.
# Knobs: the environment variables here and in train_knobs.sh; extra key=value words pass through.
set -euo pipefail

DATA="${DATA:-demo_pref}"                       # preference dataset(s) in $DATASET_DIR/dataset_info.json
EVAL_DATA="${EVAL_DATA:-demo_pref_eval}"
RUN_NAME="${RUN_NAME:-foodpo-qwen}"
BETA="${BETA:-}"                                # pref_beta
BETA_SCALE="${BETA_SCALE:-}"                    # pref_beta_scale; 0 gives plain DPO
source "$(dirname "$0")/train_knobs.sh"

mpskit train stage=foodpo "${TRAIN_ARGS[@]}" ${BETA:+pref_beta=$BETA} ${BETA_SCALE:+pref_beta_scale=$BETA_SCALE} "$@"
