#!/usr/bin/env bash
# Plain DPO and fooDPO for a list of pref_beta_scale values, same data and seed, then one table
# (CSV and Markdown) and one plot. Defaults run offline on the tiny demo model in a few minutes.
# Knobs: SCALES and OUT here, the rest in train_knobs.sh.
set -euo pipefail

SCALES="${SCALES:-0.05 0.1 0.2 0.5}"            # fooDPO scales; plain DPO always runs first
OUT="${OUT:-output/compare-beta-scale/$(date +%Y%m%d-%H%M%S)}"
MODEL_PRESET="${MODEL_PRESET:-tiny}"
if [[ -z "${DATA:-}" ]]; then                 # the demo data and its held-out set (your DATA: as mpskit train)
    DATA=demo_pref EVAL_DATA="${EVAL_DATA:-demo_pref_eval}"
fi
BETA="${BETA:-0.1}"
LR="${LR:-5e-3}"
EPOCHS="${EPOCHS:-2}"
MAX_SEQ_LEN="${MAX_SEQ_LEN:-128}"
SEED="${SEED:-42}"
source "$(dirname "$0")/train_knobs.sh"

mpskit train stage=dpo "${TRAIN_ARGS[@]}" run_name=compare-dpo
runs=("$(readlink -f output/compare-dpo/latest)")
for scale in $SCALES; do
    mpskit train stage=foodpo "${TRAIN_ARGS[@]}" pref_beta_scale="$scale" run_name="compare-foodpo-$scale"
    runs+=("$(readlink -f "output/compare-foodpo-$scale/latest")")
done
mpskit compare --out "$OUT" "${runs[@]}"
