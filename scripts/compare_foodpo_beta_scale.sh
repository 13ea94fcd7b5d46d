#!/usr/bin/env bash
# Plain DPO and fooDPO for a list of pref_beta_scale values, same data and seed, then one table
# (CSV and Markdown) and one plot. Defaults run offline on the tiny demo model in a few minutes.
set -euo pipefail

MODEL_PRESET="${MODEL_PRESET:-tiny}"            # configs/models/<name>.yaml
MODEL_PATH="${MODEL_PATH:-}"                    # empty = the preset's model
SCALES="${SCALES:-0.05 0.1 0.2 0.5}"            # fooDPO scales; plain DPO always runs first
DATA="${DATA:-demo_pref}"
EVAL_DATA="${EVAL_DATA:-demo_pref_eval}"
BETA="${BETA:-0.1}"
LR="${LR:-5e-3}"
EPOCHS="${EPOCHS:-2}"
MAX_SEQ_LEN="${MAX_SEQ_LEN:-128}"
SEED="${SEED:-42}"
OUT="${OUT:-output/compare-beta-scale/$(date +%Y%m%d-%H%M%S)}"

if [[ "$MODEL_PRESET" == tiny && -z "$MODEL_PATH" && ! -f output/tiny-model/config.json ]]; then
    mpskit tiny-model output/tiny-model
fi
common=(model_preset="$MODEL_PRESET" ${MODEL_PATH:+model_name_or_path="$MODEL_PATH"} dataset="$DATA"
        eval_dataset="$EVAL_DATA" pref_beta="$BETA" learning_rate="$LR" num_train_epochs="$EPOCHS"
        cutoff_len="$MAX_SEQ_LEN" seed="$SEED")

mpskit train stage=dpo run_name=compare-dpo "${common[@]}"
runs=("$(readlink -f output/compare-dpo/latest)")
for scale in $SCALES; do
    mpskit train stage=foodpo pref_beta_scale="$scale" run_name="compare-foodpo-$scale" "${common[@]}"
    runs+=("$(readlink -f "output/compare-foodpo-$scale/latest")")
done
mpskit compare --out "$OUT" "${runs[@]}"
