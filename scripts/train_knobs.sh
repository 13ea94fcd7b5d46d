# The environment knobs of every script here (run_sft.sh, run_dpo.sh, test_qwen_foodpo.sh,
# compare_foodpo_beta_scale.sh), sourced, not run. Each knob is an environment variable; an empty one
# keeps the preset's value. A script sets its own defaults first, then sources this. Sets TRAIN_ARGS.
MODEL_PRESET="${MODEL_PRESET:-qwen1.5-0.5b}"    # configs/models/<name>.yaml: path, template, dimensions
MODEL_PATH="${MODEL_PATH:-}"                    # local directory or hub id; empty = the preset's own
HARDWARE="${HARDWARE:-}"                        # configs/hardware/<name>.yaml; empty = detect
DATASET_DIR="${DATASET_DIR:-data}"              # folder with dataset_info.json
DATA="${DATA:-}"                                # dataset name(s) in $DATASET_DIR/dataset_info.json
EVAL_DATA="${EVAL_DATA:-}"                      # held-out dataset name(s)
RUN_NAME="${RUN_NAME:-}"                        # output/<RUN_NAME>/<time>
MAX_SEQ_LEN="${MAX_SEQ_LEN:-}"                  # cutoff_len
LORA_RANK="${LORA_RANK:-}"
BATCH="${BATCH:-}"                              # per_device_train_batch_size
GRAD_ACCUM="${GRAD_ACCUM:-}"                    # gradient_accumulation_steps
LR="${LR:-}"                                    # learning_rate
EPOCHS="${EPOCHS:-}"                            # num_train_epochs
SEED="${SEED:-}"
BETA="${BETA:-}"                                # pref_beta (dpo, foodpo)
BETA_SCALE="${BETA_SCALE:-}"                    # pref_beta_scale (foodpo); 0 gives plain DPO
LEAN_LOGITS="${LEAN_LOGITS:-}"                  # true / false; empty = auto (on for LoRA sft, dpo, foodpo)
LEAN_ATTENTION="${LEAN_ATTENTION:-}"            # true / false; empty = auto (on where SDPA is not fused: MPS)

if ! command -v mpskit >/dev/null; then         # run directly: not from make, no environment activated
    VENV_BIN="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin"
    if [[ ! -x "$VENV_BIN/mpskit" ]]; then
        echo "mpskit: error: mpskit is not installed here; run make install, or activate the environment that has it" >&2
        exit 2
    fi
    PATH="$VENV_BIN:$PATH"
fi
if [[ "$MODEL_PRESET" == tiny && -z "$MODEL_PATH" ]]; then
    mpskit tiny-model                           # the offline demo model, built once where its preset looks
fi
eval "$(mpskit env ${HARDWARE:+--hardware "$HARDWARE"})"
DATA_FOLDER="$DATASET_DIR"
if [[ "$DATA" == */* || "$DATA" == *.json || "$DATA" == *.jsonl ]]; then
    DATA_FOLDER=""                              # a data file or folder of its own: no dataset_info.json
fi
TRAIN_ARGS=(
    model_preset="$MODEL_PRESET" ${DATA_FOLDER:+dataset_dir="$DATA_FOLDER"} ${HARDWARE:+--hardware "$HARDWARE"}
    ${MODEL_PATH:+model_name_or_path="$MODEL_PATH"} ${RUN_NAME:+run_name="$RUN_NAME"}
    ${DATA:+dataset="$DATA"} ${EVAL_DATA:+eval_dataset="$EVAL_DATA"}
    ${MAX_SEQ_LEN:+cutoff_len="$MAX_SEQ_LEN"} ${LORA_RANK:+lora_rank="$LORA_RANK"}
    ${BATCH:+per_device_train_batch_size="$BATCH"} ${GRAD_ACCUM:+gradient_accumulation_steps="$GRAD_ACCUM"}
    ${LR:+learning_rate="$LR"} ${EPOCHS:+num_train_epochs="$EPOCHS"} ${SEED:+seed="$SEED"}
    ${BETA:+pref_beta="$BETA"} ${BETA_SCALE:+pref_beta_scale="$BETA_SCALE"} ${LEAN_LOGITS:+lean_logits="$LEAN_LOGITS"}
    ${LEAN_ATTENTION:+lean_attention="$LEAN_ATTENTION"}
)
