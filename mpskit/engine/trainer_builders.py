"""LLaMA-Factory's SFT and DPO trainers as mpskit runs them (lean, fooDPO's), built outside a run the way
run_sft and run_dpo build theirs, for the measurements and tests that need the trainer object itself."""

from __future__ import annotations

import functools

from llamafactory.extras.constants import IGNORE_INDEX

from mpskit.engine.foodpo_trainer import FooDPOTrainer
from mpskit.engine.lean_trainers import CustomDPOTrainer, LeanDPOTrainer, LeanPath
from mpskit.settings.foodpo import FooDPOConfig


def build_trainer(args: dict, trainer_class):
    """A trainer for an sft or dpo run built the way LLaMA-Factory's run_sft / run_dpo build theirs
    (its data, collator and model), for measurements and tests that need the trainer object itself."""
    from llamafactory.data import (
        PairwiseDataCollatorWithPadding,
        SFTDataCollatorWith4DAttentionMask,
        get_dataset,
        get_template_and_fix_tokenizer,
    )
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    sft = args["stage"] == "sft"
    dataset_module = get_dataset(
        template, model_args, data_args, training_args, stage="sft" if sft else "rm", **tokenizer_module
    )
    model = load_model(tokenizer_module["tokenizer"], model_args, finetuning_args, training_args.do_train)
    collator_class = SFTDataCollatorWith4DAttentionMask if sft else PairwiseDataCollatorWithPadding
    collator = collator_class(
        template=template, model=model, pad_to_multiple_of=8, label_pad_token_id=IGNORE_INDEX, **tokenizer_module
    )
    extra = {} if sft else {"ref_model": None}
    return trainer_class(
        model=model,
        args=training_args,
        finetuning_args=finetuning_args,
        data_collator=collator,
        callbacks=[],
        **extra,
        **dataset_module,
        **tokenizer_module,
    )


def build_dpo_trainer(args: dict, foodpo: FooDPOConfig | None = None, lean: bool = False) -> CustomDPOTrainer:
    """LLaMA-Factory's DPO trainer as mpskit runs it (fooDPO's, given a config; its lean path on or
    off) built the way run_dpo builds it, for measurements and tests that need the trainer itself."""
    if foodpo is not None:
        cls = functools.partial(FooDPOTrainer, foodpo=foodpo, lean=LeanPath(lean))
    else:
        cls = functools.partial(LeanDPOTrainer, lean=LeanPath(lean))
    return build_trainer(dict(args, stage="dpo"), cls)
