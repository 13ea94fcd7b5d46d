"""Training keys transformers 5 removed or renamed, each translated or dropped with a one-line reason.

Derived from the code, not from memory. TRANSFORMERS_4_FIELDS is every init field of
`transformers.TrainingArguments` in 4.57.6, the last 4.x release LLaMA-Factory 0.9.5 accepts
(`transformers>=4.55.0,<=5.6.0`), read from that release's training_args.py with `ast`
(Seq2SeqTrainingArguments adds the same five fields in both). tests/test_removed_keys.py diffs it
against the installed TrainingArguments: a new pin that removes more fails until they are here.
"""

from __future__ import annotations

from mpskit.errors import warn

TRANSFORMERS_4_FIELDS = (
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy",
    "prediction_loss_only", "per_device_train_batch_size", "per_device_eval_batch_size",
    "per_gpu_train_batch_size", "per_gpu_eval_batch_size", "gradient_accumulation_steps",
    "eval_accumulation_steps", "eval_delay", "torch_empty_cache_steps", "learning_rate", "weight_decay",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "log_level",
    "log_level_replica", "log_on_each_node", "logging_dir", "logging_strategy", "logging_first_step",
    "logging_steps", "logging_nan_inf_filter", "save_strategy", "save_steps", "save_total_limit",
    "save_safetensors", "save_on_each_node", "save_only_model", "restore_callback_states_from_checkpoint",
    "no_cuda", "use_cpu", "use_mps_device", "seed", "data_seed", "jit_mode_eval", "bf16", "fp16",
    "fp16_opt_level", "half_precision_backend", "bf16_full_eval", "fp16_full_eval", "tf32", "local_rank",
    "ddp_backend", "tpu_num_cores", "tpu_metrics_debug", "debug", "dataloader_drop_last", "eval_steps",
    "dataloader_num_workers", "dataloader_prefetch_factor", "past_index", "run_name", "disable_tqdm",
    "remove_unused_columns", "label_names", "load_best_model_at_end", "metric_for_best_model",
    "greater_is_better", "ignore_data_skip", "fsdp", "fsdp_min_num_params", "fsdp_config",
    "fsdp_transformer_layer_cls_to_wrap", "accelerator_config", "parallelism_config", "deepspeed",
    "label_smoothing_factor", "optim", "optim_args", "adafactor", "group_by_length", "length_column_name",
    "report_to", "project", "trackio_space_id", "ddp_find_unused_parameters", "ddp_bucket_cap_mb",
    "ddp_broadcast_buffers", "dataloader_pin_memory", "dataloader_persistent_workers", "skip_memory_metrics",
    "use_legacy_prediction_loop", "push_to_hub", "resume_from_checkpoint", "hub_model_id", "hub_strategy",
    "hub_token", "hub_private_repo", "hub_always_push", "hub_revision", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "include_inputs_for_metrics", "include_for_metrics",
    "eval_do_concat_batches", "fp16_backend", "push_to_hub_model_id", "push_to_hub_organization",
    "push_to_hub_token", "mp_parameters", "auto_find_batch_size", "full_determinism", "torchdynamo",
    "ray_scope", "ddp_timeout", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "include_tokens_per_second", "include_num_input_tokens_seen", "neftune_noise_alpha",
    "optim_target_modules", "batch_eval_metrics", "eval_on_start", "use_liger_kernel", "liger_kernel_config",
    "eval_use_gather_object", "average_tokens_across_devices",
)  # fmt: skip

# Renamed: the value moves to the new key as it is.
RENAMED = {
    "per_gpu_train_batch_size": "per_device_train_batch_size",
    "per_gpu_eval_batch_size": "per_device_eval_batch_size",
    "push_to_hub_model_id": "hub_model_id",
    "push_to_hub_token": "hub_token",
    "torchdynamo": "torch_compile_backend",
}
# Switches whose `true` became a value of another key; `false` is the default there, so it is dropped.
SWITCHED = {
    "no_cuda": ("use_cpu", True),
    "group_by_length": ("train_sampling_strategy", "group_by_length"),
    "adafactor": ("optim", "adafactor"),
    "include_inputs_for_metrics": ("include_for_metrics", ["inputs"]),
}
# Gone with nothing to take their place here: dropped, and why.
DROPPED = {
    "overwrite_output_dir": "mpskit writes every run to a new folder and never into one that holds files",
    "use_mps_device": "MPS comes from the hardware profile",
    "save_safetensors": "transformers 5 always saves safetensors",
    "jit_mode_eval": "TorchScript evaluation was removed",
    "fp16_opt_level": "apex AMP was removed; fp16 runs on torch.amp",
    "fp16_backend": "apex AMP was removed; fp16 runs on torch.amp",
    "half_precision_backend": "torch.amp is the only backend",
    "tpu_num_cores": "the TPU launcher settings were removed",
    "tpu_metrics_debug": "the TPU launcher settings were removed",
    "past_index": "it served TransformerXL/XLNet-style memories only",
    "fsdp_min_num_params": "give min_num_params inside fsdp_config",
    "fsdp_transformer_layer_cls_to_wrap": "give transformer_layer_cls_to_wrap inside fsdp_config",
    "use_legacy_prediction_loop": "the legacy prediction loop was removed",
    "push_to_hub_organization": "give hub_model_id as organization/name",
    "mp_parameters": "SageMaker model-parallel settings were removed",
    "ray_scope": "the Ray hyperparameter-search scope was removed",
    "include_tokens_per_second": "transformers 5 reports tokens seen (include_num_input_tokens_seen) instead",
}
TABLE_KEYS = (*RENAMED, *SWITCHED, *DROPPED)


def translate_removed_keys(args: dict) -> dict:
    """Rewrite or drop the keys transformers 5 no longer accepts, one warning each; a value the user
    also gave under the new key wins. Also LLaMA-Factory's own spelling of gradient checkpointing."""
    args = dict(args)
    for old, new in RENAMED.items():
        if old in args:
            value = args.pop(old)
            warn(f"'{old}' was renamed in transformers 5; using '{new}: {value}'")
            args.setdefault(new, value)
    for old, (new, value) in SWITCHED.items():
        if old in args:
            if args.pop(old):
                warn(f"'{old}' was removed from transformers 5; using '{new}: {value}' instead")
                args.setdefault(new, value)
            else:
                warn(f"'{old}: false' was removed from transformers 5 (it is the default); key dropped")
    for old, why in DROPPED.items():
        if old in args:
            args.pop(old)
            warn(f"'{old}' was removed from transformers 5 ({why}); key dropped")
    if "gradient_checkpointing" in args:
        value = args.pop("gradient_checkpointing")
        warn(
            "'gradient_checkpointing' is not LLaMA-Factory's switch (it checkpoints by default); "
            "using 'disable_gradient_checkpointing' instead"
        )
        args.setdefault("disable_gradient_checkpointing", not value)
    return args
