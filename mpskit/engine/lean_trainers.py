"""LLaMA-Factory's SFT and DPO trainers on the lean-logits path (see lean_logits.py), with lean
attention (lean_attention.py) set on their models when asked.

Each trainer overrides the one method that turns the model's output into log-probabilities (SFT's
`compute_loss`, DPO's `concatenated_forward`) and keeps everything else of LLaMA-Factory's: the same
losses, the same metrics, the same logging. Where the lean path cannot run (an unsupported model,
a trained output layer, LD-DPO, SFT metrics that need whole logits) that part takes LLaMA-Factory's
own path and says so once; `report` tells the caller which path ran. Both also save and resume
through resumable.py (checkpoints that appear only when complete). Imports torch and LLaMA-Factory.
"""

from __future__ import annotations

import inspect

import torch
from llamafactory.extras.constants import IGNORE_INDEX
from llamafactory.train.dpo import trainer as lf_dpo_trainer
from llamafactory.train.dpo import workflow as lf_dpo_workflow
from llamafactory.train.sft import workflow as lf_sft_workflow
from llamafactory.train.trainer_utils import nested_detach

from mpskit.engine.lean_attention import LeanAttention
from mpskit.engine.lean_logits import final_hidden_states, mean_logit_per_position, next_token_logps, output_weight
from mpskit.engine.lean_switch import LeanSwitch
from mpskit.engine.resumable import Resumable
from mpskit.errors import MpskitError

CustomDPOTrainer = lf_dpo_trainer.CustomDPOTrainer
CustomSeq2SeqTrainer = lf_sft_workflow.CustomSeq2SeqTrainer


class LeanPath(LeanSwitch):
    """The lean-logits switch of one run and what actually ran, for mpskit.json."""

    name, instead, plain = "lean logits", "LLaMA-Factory's own path", "plain"

    def weight(self, model: torch.nn.Module, part: str) -> torch.Tensor | None:
        """The output weights when `part` (training, evaluation, ...) may take the lean path, else None."""
        if not self.enabled:
            return None
        weight, why = output_weight(model)
        if weight is None:
            self.off_for(part, why)
        return weight

    def off_for(self, part: str, why: str) -> None:
        self.fall_back(f"{part}: {why}", training=part == "training")


def set_attention(trainer, attention: LeanAttention | None) -> None:
    """Lean attention on the trainer's models (the policy, and a separate reference model if any)."""
    for model in (trainer.model, getattr(trainer, "ref_model", None)):
        if attention is not None and model is not None:
            attention.install(model)


class LeanSFTTrainer(Resumable, CustomSeq2SeqTrainer):
    """SFT's loss (transformers' token-mean cross-entropy) from the lean log-probabilities."""

    def __init__(self, *args, lean: LeanPath, attention: LeanAttention | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lean = lean
        set_attention(self, attention)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None, **kwargs):
        part = "training" if model.training else "evaluation"
        if "labels" not in inputs:  # no loss to compute
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch, **kwargs)
        if self.label_smoother is not None or self.compute_loss_func is not None:
            if self.lean.enabled:
                self.lean.off_for(part, "a custom or smoothed loss needs whole logits")
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch, **kwargs)
        if return_outputs and self.compute_metrics is not None:
            if self.lean.enabled:
                self.lean.off_for(part, "compute_accuracy / predict_with_generate need whole logits")
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch, **kwargs)
        weight = self.lean.weight(model, part)
        if weight is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch, **kwargs)
        self.lean.used(model.training)
        labels = inputs["labels"]
        hidden = final_hidden_states(model, {key: value for key, value in inputs.items() if key != "labels"})
        scored = labels[:, 1:] != IGNORE_INDEX
        logps = next_token_logps(hidden, weight, inputs["input_ids"], labels, scored)
        # as transformers' ForCausalLMLoss: a sum over the tokens of the accumulated batch, or a mean
        uses_item_count = self.model_accepts_loss_kwargs and num_items_in_batch is not None
        loss = -logps.sum() / (num_items_in_batch if uses_item_count else scored.sum())
        if self.args.average_tokens_across_devices and uses_item_count:
            loss = loss * (self.accelerator.num_processes if self.args.n_gpu <= 1 else self.args.n_gpu)
        return (loss, {"loss": loss}) if return_outputs else loss


class LeanDPOTrainer(Resumable, CustomDPOTrainer):
    """DPO's policy and reference log-probabilities (and the mean-logit metrics) from the lean path."""

    def __init__(self, *args, lean: LeanPath, attention: LeanAttention | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lean = lean
        set_attention(self, attention)

    def extra_scored_positions(self, batch: dict, is_ref_model: bool) -> torch.Tensor | None:
        """Positions beyond the answers whose next-token log-probability a subclass needs."""
        return None

    def compute_preference_loss(self, policy_chosen, policy_rejected, reference_chosen, reference_rejected):
        """LLaMA-Factory's loss; keeps each pair's log-ratio gap, the reward margin with beta factored
        out, so runs of different (or dynamic) betas compare on one scale."""
        if reference_chosen is not None:
            gap = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
            self._log_ratio_gap = gap.detach().float().mean().item()
        return super().compute_preference_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected)

    def get_batch_loss_metrics(self, model, batch, train_eval="train"):
        self._log_ratio_gap = None
        loss, metrics = super().get_batch_loss_metrics(model, batch, train_eval)
        if self._log_ratio_gap is not None:
            metrics[f"{'eval_' if train_eval == 'eval' else ''}rewards/log_ratio_gap"] = self._log_ratio_gap
        return loss, metrics

    def concatenated_forward(self, model, batch, is_ref_model: bool = False):
        part = "reference forward" if is_ref_model else "training" if model.training else "evaluation"
        if self.lean.enabled and self.ld_alpha is not None and not is_ref_model:
            self.lean.off_for(part, "LD-DPO (ld_alpha) weighs tokens by position over whole logits")
            return super().concatenated_forward(model, batch, is_ref_model=is_ref_model)
        weight = self.lean.weight(model, part)
        if weight is None:
            return super().concatenated_forward(model, batch, is_ref_model=is_ref_model)
        self.lean.used(model.training and not is_ref_model)
        if self.finetuning_args.use_ref_model:
            batch = nested_detach(batch, clone=True)
        batch = dict(batch)
        labels = batch.pop("labels")
        hidden = final_hidden_states(model, batch)
        answer = labels[:, 1:] != IGNORE_INDEX
        extra = self.extra_scored_positions({**batch, "labels": labels}, is_ref_model)
        token_logps = next_token_logps(
            hidden, weight, batch["input_ids"], labels, answer if extra is None else answer | extra
        )
        # as LLaMA-Factory's get_batch_logps, then the rest of its concatenated_forward
        all_logps, valid_length = (token_logps * answer).sum(-1), answer.sum(-1)
        if self.loss_type in ["ipo", "orpo", "simpo"]:
            all_logps = all_logps / valid_length
        half = batch["input_ids"].size(0) // 2
        chosen_logps, rejected_logps = all_logps.split(half, dim=0)
        mean_logits = mean_logit_per_position(hidden, weight)
        chosen_length, _ = valid_length.split(half, dim=0)
        average = chosen_logps if self.loss_type in ["ipo", "orpo", "simpo"] else chosen_logps / chosen_length
        return {
            "chosen_logps": chosen_logps,
            "rejected_logps": rejected_logps,
            "chosen_logits": mean_logits[:half],  # their mean is the mean of the whole logits
            "rejected_logits": mean_logits[half:],
            "chosen_logps_avg": average,
            "token_logps": token_logps.detach(),
        }


def check_seam() -> None:
    """The pinned LLaMA-Factory must still build its trainers by these names: the SFT workflow from
    its module's name, the DPO workflow by importing it from dpo/trainer.py when it runs."""
    dpo_methods = ("concatenated_forward", "compute_preference_loss", "get_batch_loss_metrics")
    dpo_source = inspect.getsource(lf_dpo_workflow.run_dpo)
    if (
        not hasattr(lf_sft_workflow, "CustomSeq2SeqTrainer")
        or "from .trainer import CustomDPOTrainer" not in dpo_source
        or not all(hasattr(CustomDPOTrainer, name) for name in dpo_methods)
    ):
        raise MpskitError(
            "this LLaMA-Factory no longer builds its trainers the way mpskit hooks into",
            "install the pinned llamafactory==0.9.5 (make install)",
        )
