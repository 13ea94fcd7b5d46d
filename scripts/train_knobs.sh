# Knobs shared by run_sft.sh, run_dpo.sh and test_qwen_foodpo.sh (sourced, not run).
# Every knob is an environment variable; empty ones keep the preset's value. Sets TRAIN_ARGS.
MODEL_PATH="${MODEL_PATH:-Qwen/Qwen1.5-0.5B}"   # local directory or hub id (hub ids need network)
MODEL_PRESET="${MODEL_PRESET:-qwen1.5-0.5b}"    # configs/models/<name>.yaml: template and dimensions
HARDWARE="${HARDWARE:-}"                        # configs/hardware/<name>.yaml; empty = detect
DATASET_DIR="${DATASET_DIR:-data}"              # folder with dataset_info.json
MAX_SEQ_LEN="${MAX_SEQ_LEN:-}"                  # cutoff_len
LORA_RANK="${LORA_RANK:-}"
BATCH="${BATCH:-}"                              # per_device_train_batch_size
GRAD_ACCUM="${GRAD_ACCUM:-}"                    # gradient_accumulation_steps
LR="${LR:-}"                                    # learning_rate
EPOCHS="${EPOCHS:-}"                            # num_train_epochs
LEAN_LOGITS="${LEAN_LOGITS:-}"                  # true / false; empty = auto (on for LoRA sft, dpo, foodpo)

eval "$(mpskit env ${HARDWARE:+--hardware "$HARDWARE"})"
TRAIN_ARGS=(
    model_preset="$MODEL_PRESET" model_name_or_path="$MODEL_PATH" run_name="$RUN_NAME"
    dataset="$DATA" eval_dataset="$EVAL_DATA" dataset_dir="$DATASET_DIR"
    ${HARDWARE:+--hardware "$HARDWARE"}
    ${MAX_SEQ_LEN:+cutoff_len=$MAX_SEQ_LEN} ${LORA_RANK:+lora_rank=$LORA_RANK}
    ${BATCH:+per_device_train_batch_size=$BATCH} ${GRAD_ACCUM:+gradient_accumulation_steps=$GRAD_ACCUM}
    ${LR:+learning_rate=$LR} ${EPOCHS:+num_train_epochs=$EPOCHS} ${LEAN_LOGITS:+lean_logits=$LEAN_LOGITS}
)
