"""The fooDPO trainer: LLaMA-Factory's own DPO trainer with a per-example, detached beta.

The prompt perplexity comes from the forward pass DPO already does (the chosen half of the batch):
its logits, or on the lean path the next-token log-probabilities of the prompt positions, computed
in the same chunked pass as the answers'. Never an extra pass. Imports torch and LLaMA-Factory.
"""

from __future__ import annotations

import torch
from llamafactory.extras.constants import IGNORE_INDEX

from mpskit.engine.lean_trainers import LeanDPOTrainer
from mpskit.settings.foodpo import FooDPOConfig


def prompt_positions(labels: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(batch, seq - 1): where the next token is a scored prompt token.

    A prompt token has label IGNORE_INDEX and attention mask 1; it is scored when the position
    before it is a real token too (the first prompt token has no prediction; the prediction of the
    first response token belongs to the response). Padding is found by the mask, not by token id.
    """
    is_prompt = (labels == IGNORE_INDEX) & attention_mask.bool()
    return is_prompt[:, 1:] & attention_mask[:, :-1].bool()


@torch.no_grad()
def prompt_log_perplexity(
    logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor, input_ids: torch.Tensor
) -> torch.Tensor:
    """Mean negative log-likelihood of each row's prompt tokens, shape (batch,), from whole logits.
    Rows without scored prompt tokens get 0 (perplexity 1)."""
    scored = prompt_positions(labels, attention_mask)
    rows, positions = scored.nonzero(as_tuple=True)
    selected = logits[rows, positions].float()  # predictions for tokens at positions + 1
    targets = input_ids[rows, positions + 1]
    nll = torch.logsumexp(selected, dim=-1) - selected.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    total = torch.zeros(labels.size(0), dtype=torch.float32, device=logits.device).index_add_(0, rows, nll)
    return total / scored.sum(dim=-1).clamp(min=1)


@torch.no_grad()
def prompt_log_perplexity_from_logps(token_logps: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """The same from the lean path's next-token log-probabilities (batch, seq - 1)."""
    return -(token_logps * scored).sum(dim=-1) / scored.sum(dim=-1).clamp(min=1)


def dynamic_beta(log_ppl: torch.Tensor, pref_beta: float, config: FooDPOConfig) -> torch.Tensor:
    """beta_i = pref_beta * scale * log(max(PPL_i, 1)), optionally clamped; no gradient."""
    beta = pref_beta * config.pref_beta_scale * log_ppl.detach().clamp(min=0.0)
    if config.beta_min is not None or config.beta_max is not None:
        beta = beta.clamp(min=config.beta_min, max=config.beta_max)
    return beta


class FooDPOTrainer(LeanDPOTrainer):
    """LLaMA-Factory's DPO trainer (on the lean path when it is on) whose beta, during the loss, is
    one detached value per pair."""

    def __init__(self, *args, foodpo: FooDPOConfig, **kwargs):
        super().__init__(*args, **kwargs)
        self.foodpo = foodpo
        self._log_ppl: dict[str, torch.Tensor] = {}

    def _scores_prompt(self, is_ref_model: bool) -> bool:
        return self.foodpo.ppl_source == ("reference" if is_ref_model else "policy")

    def extra_scored_positions(self, batch: dict, is_ref_model: bool) -> torch.Tensor | None:
        """The chosen half's prompt tokens, so the lean pass scores them too: in the policy's pass and the
        reference's alike, whichever one the perplexity is read from. Both then take the answers'
        log-probabilities over the same positions in the same chunks, so before training the two are
        equal to the bit (scored apart, the base model's log-ratio gap read 1e-7, not 0)."""
        scored = prompt_positions(batch["labels"], batch["attention_mask"])
        scored[scored.size(0) // 2 :] = False
        return scored

    def concatenated_forward(self, model, batch, is_ref_model: bool = False):
        labels, attention_mask, input_ids = batch["labels"], batch["attention_mask"], batch["input_ids"]
        output = super().concatenated_forward(model, batch, is_ref_model=is_ref_model)
        if self._scores_prompt(is_ref_model):
            source = "reference" if is_ref_model else "policy"
            half = labels.size(0) // 2
            if "token_logps" in output:
                scored = prompt_positions(labels[:half], attention_mask[:half])
                self._log_ppl[source] = prompt_log_perplexity_from_logps(output["token_logps"][:half], scored)
            else:
                self._log_ppl[source] = prompt_log_perplexity(
                    output["chosen_logits"], labels[:half], attention_mask[:half], input_ids[:half]
                )
        return output

    def compute_preference_loss(self, *args, **kwargs):
        if self.foodpo.pref_beta_scale == 0:  # exactly LLaMA-Factory's DPO
            return super().compute_preference_loss(*args, **kwargs)
        scalar_beta = self.beta
        self.beta = dynamic_beta(self._log_ppl[self.foodpo.ppl_source], scalar_beta, self.foodpo)
        try:
            return super().compute_preference_loss(*args, **kwargs)
        finally:
            self.beta = scalar_beta

    def get_batch_loss_metrics(self, model, batch, train_eval="train"):
        loss, metrics = super().get_batch_loss_metrics(model, batch, train_eval)
        log_ppl = self._log_ppl.pop(self.foodpo.ppl_source)
        if self.foodpo.pref_beta_scale == 0:
            beta = torch.full_like(log_ppl, self.beta)
        else:
            beta = dynamic_beta(log_ppl, self.beta, self.foodpo)
        prefix = "eval_" if train_eval == "eval" else ""
        metrics[f"{prefix}prompt_perplexity"] = log_ppl.exp().mean().item()
        metrics[f"{prefix}log_prompt_perplexity"] = log_ppl.mean().item()
        metrics[f"{prefix}dynamic_beta"] = beta.mean().item()
        return loss, metrics
