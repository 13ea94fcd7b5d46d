"""Per-token log-probabilities of a causal LM without ever holding its full-vocabulary logits.

A Qwen step spends most of its memory on float32 logits: one 151,936-wide row per token position,
held several times (the log-softmax, the reference forward of DPO, the backward). Training only
needs the log-probability of each position's next token. `token_logps` computes it from the final
hidden states and the frozen output weights a chunk of positions at a time: while a chunk's logits
exist it also computes that chunk's gradient with respect to the hidden states,

    d logp / d h = W[target] - softmax(h W^T) W

and keeps only that (one hidden-sized row per position), so the backward is a multiplication and no
logits are recomputed. The output layer gets no gradient: under LoRA it is frozen (callers check).
Pure PyTorch, so it runs on MPS, CUDA and the CPU alike.
"""

from __future__ import annotations

import torch

# One chunk's float32 logits stay under this size (about 220 positions for Qwen's vocabulary); the
# memory model counts the same constant.
from mpskit.plan.memory import LEAN_CHUNK_BYTES as CHUNK_BYTES

# LEAN_MODEL_TYPES (the memory model's table): their causal-LM head is exactly `lm_head(hidden_states)`,
# with no logit scaling or soft-capping.
from mpskit.plan.memory import LEAN_MODEL_TYPES


def chunk_rows(vocab: int) -> int:
    return max(1, CHUNK_BYTES // (4 * vocab))


class _ChunkedTokenLogps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, with_grad: bool):
        logps = torch.empty(hidden.size(0), dtype=torch.float32, device=hidden.device)
        grad = torch.empty_like(hidden) if with_grad else None
        rows = chunk_rows(weight.size(0))
        for start in range(0, hidden.size(0), rows):
            end = start + rows
            # the same operations as LLaMA-Factory's get_batch_logps on whole logits, a chunk of rows at a time;
            # the hidden states at the weights' dtype, as autocast gives the output layer (accelerate hands
            # them back in float32 under mixed precision, while a 16-bit checkpoint keeps 16-bit weights)
            rows_in = hidden[start:end].to(weight.dtype)
            log_softmax = torch.nn.functional.linear(rows_in, weight).float().log_softmax(-1)
            target = targets[start:end].unsqueeze(1)
            logps[start:end] = log_softmax.gather(1, target).squeeze(1)
            if grad is not None:
                softmax = log_softmax.exp_()
                softmax.scatter_add_(1, target, torch.full_like(target, -1, dtype=softmax.dtype))
                grad[start:end] = softmax.to(weight.dtype) @ weight  # softmax - one-hot, times W: -d logp / dh
                del softmax  # the same tensor as log_softmax: kept, it would make three chunks live
            del log_softmax
        ctx.save_for_backward(grad)
        return logps

    @staticmethod
    def backward(ctx, grad_logps: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # in float32 and rounded once to the hidden states' dtype, as autograd rounds a float32 product
        return (grad.float() * -grad_logps.unsqueeze(1)).to(grad.dtype), None, None, None


def token_logps(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[i] | hidden[i]) in float32, for rows of hidden (n, H), output weights (V, H)."""
    with_grad = torch.is_grad_enabled() and hidden.requires_grad
    return _ChunkedTokenLogps.apply(hidden, weight, targets, with_grad)


def next_token_logps(
    hidden: torch.Tensor, weight: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor, scored: torch.Tensor
) -> torch.Tensor:
    """(batch, seq - 1) log-probabilities of each next token where `scored` (batch, seq - 1) is set, 0
    elsewhere. The target is the label where there is one, else the next input token (for prompts)."""
    next_labels = labels[:, 1:]
    targets = torch.where(next_labels >= 0, next_labels, input_ids[:, 1:])
    batch, seq = hidden.shape[:2]
    rows, positions = scored.nonzero(as_tuple=True)
    flat = hidden.reshape(batch * seq, -1).index_select(0, rows * seq + positions)
    logps = token_logps(flat, weight, targets[rows, positions])
    return torch.zeros(scored.shape, dtype=torch.float32, device=hidden.device).index_put((rows, positions), logps)


def mean_logit_per_position(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The mean over the vocabulary of each position's logits, (batch, seq), without the logits:
    mean_v (h . W_v) = h . mean_v W_v. DPO logs the mean of these as logits/chosen and logits/rejected."""
    with torch.no_grad():
        mean_row = weight.sum(dim=0, dtype=torch.float32) / weight.size(0)
        return hidden.float() @ mean_row


def output_weight(model: torch.nn.Module) -> tuple[torch.Tensor | None, str]:
    """The frozen output weights of a supported causal LM, or None and why the lean path cannot run."""
    inner = _causal_lm(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    if model_type not in LEAN_MODEL_TYPES:
        return None, f"model type {model_type} is not one of {', '.join(LEAN_MODEL_TYPES)}"
    head = inner.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None, "the output layer is not a plain linear layer (adapted or quantized)"
    if head.weight.requires_grad:
        return None, "the output layer is trained (full fine-tuning or an extra trainable module)"
    return head.weight, ""


def final_hidden_states(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """The decoder's normalised output, caught at its final norm while the model's own forward runs (so
    DDP and peft see the call), with logits computed for the last position only. Asking the forward for
    its hidden states instead keeps every layer's output to the end of the pass, and under mixed
    precision accelerate hands all of them back as float32 copies (for a 7B model at 4,096 positions,
    1.7 GB beside the step's activations)."""
    caught: list[torch.Tensor] = []
    hook = _final_norm(model).register_forward_hook(lambda module, args, output: caught.append(output))
    try:
        model(**inputs, return_dict=True, use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    return caught[-1]


def _final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The norm the LEAN_MODEL_TYPES apply last, whose output is the last hidden state."""
    return _causal_lm(model).model.norm


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DistributedDataParallel and peft."""
    from peft import PeftModel

    inner = model.module if hasattr(model, "module") else model
    return inner.get_base_model() if isinstance(inner, PeftModel) else inner
