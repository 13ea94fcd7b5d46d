#!/bin/bash

# 运行DPO训练
llamafactory-cli train examples/train_lora/qwen1_5_0_5b_lora_dpo_test.yaml 