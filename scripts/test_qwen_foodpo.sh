#!/usr/bin/env bash
# fooDPO (DPO with a perplexity-scaled beta) with LoRA on Qwen, using the preset for this machine (or HARDWARE=<profile>).
# Every knob is an environment variable; empty ones keep the preset's value.
set -euo pipefail

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen1.5-0.5B}"   # local directory or hub id (hub ids need network)
MODEL_PRESET="${MODEL_PRESET:-qwen1.5-0.5b}"    # configs/models/<name>.yaml: template and dimensions
HARDWARE="${HARDWARE:-}"                        # configs/hardware/<name>.yaml; empty = detect
DATA="${DATA:-demo_pref}"                       # dataset name(s) in $DATASET_DIR/dataset_info.json
EVAL_DATA="${EVAL_DATA:-demo_pref_eval}"
DATASET_DIR="${DATASET_DIR:-data}"
MAX_SEQ_LEN="${MAX_SEQ_LEN:-}"                  # cutoff_len
LORA_RANK="${LORA_RANK:-}"
BATCH="${BATCH:-}"                              # per_device_train_batch_size
GRAD_ACCUM="${GRAD_ACCUM:-}"
LR="${LR:-}"
BETA="${BETA:-}"                                # pref_beta
BETA_SCALE="${BETA_SCALE:-}"                    # pref_beta_scale; 0 gives plain DPO
EPOCHS="${EPOCHS:-}"
RUN_NAME="${RUN_NAME:-foodpo-qwen}"

eval "$(mpskit env ${HARDWARE:+--hardware "$HARDWARE"})"
mpskit train stage=foodpo \
    model_preset="$MODEL_PRESET" model_name_or_path="$MODEL_PATH" run_name="$RUN_NAME" \
    dataset="$DATA" eval_dataset="$EVAL_DATA" dataset_dir="$DATASET_DIR" \
    ${HARDWARE:+--hardware "$HARDWARE"} \
    ${MAX_SEQ_LEN:+cutoff_len=$MAX_SEQ_LEN} ${LORA_RANK:+lora_rank=$LORA_RANK} \
    ${BATCH:+per_device_train_batch_size=$BATCH} ${GRAD_ACCUM:+gradient_accumulation_steps=$GRAD_ACCUM} \
    ${BETA:+pref_beta=$BETA} ${BETA_SCALE:+pref_beta_scale=$BETA_SCALE} \
    ${LR:+learning_rate=$LR} ${EPOCHS:+num_train_epochs=$EPOCHS} \
    "$@"
