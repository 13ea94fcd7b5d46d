"""Types and ranges of the knobs mpskit sets or reads, checked before anything loads.

LLaMA-Factory and transformers would catch most of these too, but minutes later and as a
traceback from deep inside; here each is one line with the fix. Every number must be finite:
`inf` and `nan` pass most range checks and then train to NaN or never end.
"""

from __future__ import annotations

from mpskit.errors import MpskitError, check_number
from mpskit.settings.knobs import evaluates

# key: (kind, smallest, largest); None means unbounded. "int" excludes booleans and 4.0.
RANGES = {
    "per_device_train_batch_size": ("int", 1, None),
    "per_device_eval_batch_size": ("int", 1, None),
    "gradient_accumulation_steps": ("int", 1, None),
    "cutoff_len": ("int", 8, None),
    "lora_rank": ("int", 1, None),
    "lora_alpha": ("int", 1, None),
    "lora_dropout": ("number", 0.0, 0.99),
    "learning_rate": ("positive", 0.0, None),
    "num_train_epochs": ("positive", 0.0, None),
    "max_steps": ("int", -1, None),
    "warmup_ratio": ("number", 0.0, 1.0),
    "warmup_steps": ("number", 0.0, None),  # transformers 5: under 1, a share of the steps
    "weight_decay": ("number", 0.0, None),
    "max_grad_norm": ("number", 0.0, None),
    "logging_steps": ("positive", 0.0, None),
    "save_steps": ("positive", 0.0, None),
    "eval_steps": ("positive", 0.0, None),
    "save_total_limit": ("int", 1, None),
    "max_samples": ("int", 1, None),
    "seed": ("int", 0, None),
    "dataloader_num_workers": ("int", 0, None),
    "pref_beta": ("positive", 0.0, None),
    "pref_ftx": ("number", 0.0, None),
    "pref_beta_scale": ("number", 0.0, None),
    "foodpo_beta_min": ("number", 0.0, None),
    "foodpo_beta_max": ("positive", 0.0, None),  # 0 makes every beta 0: a constant loss, nothing learnt
    "memory_budget_gb": ("positive", 0.0, None),
    "min_cutoff_len": ("int", 8, None),
}
SWITCHES = (
    "bf16",
    "fp16",
    "disable_gradient_checkpointing",
    "do_train",
    "use_cpu",
    "plot_loss",
    "trust_remote_code",
    "lean_logits",
    "lean_attention",
    "quantize_embeddings",
    "train_on_prompt",
    "mask_history",
    "streaming",
)
CHOICES = {
    "flash_attn": ("auto", "disabled", "sdpa", "fa2", "fa3"),
    "finetuning_type": ("lora", "freeze", "full", "oft"),
}


def check_value(key: str, value) -> None:
    if key == "max_steps" and value == 0:  # transformers 5 plans 0 steps, then takes one anyway
        raise MpskitError("max_steps=0 trains nothing", "give a positive max_steps, or -1 to train num_train_epochs")
    if key in RANGES:
        check_number(key, value, *RANGES[key], fix=f"set {key} to such a value")
    elif key in SWITCHES and not isinstance(value, bool):
        raise MpskitError(f"{key}={value!r} is not true or false", f"write {key}=true or {key}=false")
    elif key in CHOICES and value not in CHOICES[key]:
        raise MpskitError(f"{key}={value!r} is not one of {', '.join(CHOICES[key])}", f"pick one for {key}")


def check_args(args: dict) -> None:
    """Every known knob in the merged arguments; unknown keys are lf.check_keys' job."""
    for key, value in args.items():
        check_value(key, value)
    check_combinations(args)


def check_combinations(args: dict) -> None:
    """Settings LLaMA-Factory refuses together only once the run has started (its argument parser and
    DataArguments), here before anything is written."""
    stage = args.get("stage", "sft")
    for key in ("train_on_prompt", "mask_history"):
        if args.get(key) is True and stage != "sft":
            raise MpskitError(f"{key}=true applies to SFT only, not stage {stage}", f"leave {key} out")
    if args.get("train_on_prompt") is True and args.get("mask_history") is True:
        raise MpskitError("train_on_prompt and mask_history exclude each other", "keep one of them")
    if args.get("streaming") is True:
        if args.get("max_samples") is not None:
            raise MpskitError("streaming=true cannot take max_samples", "leave it out: max_steps bounds the run")
        if args.get("max_steps", -1) == -1:
            raise MpskitError("streaming=true needs max_steps (a stream has no length)", "set max_steps=N")
    _check_best_model(args)
    report_to = args.get("report_to")
    if isinstance(report_to, str) and report_to.startswith("["):
        raise MpskitError(
            f"report_to={report_to} is a list written as one word, which transformers reads as one name",
            "write report_to=wandb, or a list in the run file: report_to: [wandb, tensorboard]",
        )
    no_data = not args.get("eval_dataset") and args.get("val_size") in (None, 0, 0.0)  # any other val_size: checked
    if evaluates(args) and no_data:
        said = f"eval_strategy={args['eval_strategy']}" if str(args.get("eval_strategy") or "no") != "no" else "do_eval"
        raise MpskitError(
            f"{said} evaluates, but there is no eval_dataset and no val_size to evaluate on",
            "set eval_dataset=NAME or val_size=0.1, or eval_strategy=no",
        )


def _check_best_model(args: dict) -> None:
    """load_best_model_at_end compares checkpoints by their evaluation: transformers refuses it unless
    each save has an evaluation, the same strategy and (by steps) a save_steps that eval_steps divides."""
    save, evaluate = str(args.get("save_strategy") or "steps"), str(args.get("eval_strategy") or "no")
    if args.get("load_best_model_at_end") is not True or save == "best":
        return
    if save != evaluate:
        raise MpskitError(
            f"load_best_model_at_end=true needs save_strategy and eval_strategy alike; they are {save} and {evaluate}",
            "set both to steps (or epoch), or leave load_best_model_at_end out",
        )
    save_steps, eval_steps = args.get("save_steps", 500), args.get("eval_steps") or args.get("logging_steps", 500)
    counts = all(isinstance(n, int | float) and n >= 1 for n in (save_steps, eval_steps))  # below 1: a share of the run
    if save == "steps" and counts and save_steps % eval_steps:
        raise MpskitError(
            f"load_best_model_at_end=true needs each save evaluated: save_steps={save_steps:g} is not a multiple of "
            f"eval_steps={eval_steps:g}",
            f"set save_steps to a multiple of {eval_steps:g}",
        )
