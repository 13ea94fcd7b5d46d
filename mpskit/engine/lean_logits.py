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

import contextlib

import torch

from mpskit.engine.quantized import trim_heap
from mpskit.engine.quantized_vocab import PackedOutput, PackedRows
from mpskit.machine.allocator import trims_heap

# One chunk's float32 logits stay under this size (about 220 positions for Qwen's vocabulary); the
# memory model counts the same constant.
from mpskit.plan.memory import LEAN_CHUNK_BYTES as CHUNK_BYTES

# LEAN_MODEL_TYPES (the memory model's table): their causal-LM head is exactly `lm_head(hidden_states)`,
# with no logit scaling or soft-capping.
from mpskit.plan.memory import LEAN_MODEL_TYPES

MEAN_ROW_CHUNK_BYTES = 8 * 1024**2  # the float32 rows mean_logit_per_position sums at a time


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


class _VocabChunkedTokenLogps(_ChunkedTokenLogps):
    """The same for a packed output layer (quantize_embeddings): every position at once, a chunk of the
    vocabulary at a time, each chunk's rows dequantized as it is used. A first pass sums the
    log-softmax's normaliser chunk by chunk from a running maximum (as a streaming softmax does); with
    gradients a second computes each chunk's softmax minus one-hot, rounded as the whole path rounds
    it, times the chunk's rows in the weights' dtype (as the whole path multiplies), the chunks' products
    summed in float32 and rounded once. In float32 that equals the whole path to float32's rounding; in
    16 bits each chunk's product is rounded once more (hidden-state gradients within 0.3%, Qwen's vocabulary).
    Each chunk's float32 logits are worked on in place, its rows are dropped before the next chunk's are
    made, and on glibc the heap is trimmed after each chunk, so one chunk of each stays (the memory
    model's PACKED_CHUNK_COPIES). Untrimmed, glibc kept the chunks' freed pages: on Qwen's vocabulary
    (bench/packed_vocab.py) the step's peak was a half higher and varied by 0.1 GB from run to run; the
    trims added a fourth to that bench's step, a model with 4 layers under a 151,936-row output layer."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, pack, targets: torch.Tensor, with_grad: bool):
        n, width = hidden.shape
        rows_in = hidden.to(pack.dtype)
        running_max = torch.full((n,), -torch.inf, dtype=torch.float32, device=hidden.device)
        total = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        target_logits = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        rows = min(pack.chunk_rows(), max(1, CHUNK_BYTES // (4 * n)))
        for start, end in pack.ranges(rows):
            weight = pack.rows(start, end)
            logits = torch.nn.functional.linear(rows_in, weight).float()
            del weight
            inside, local = _in_chunk(targets, start, end)
            target_logits = torch.where(inside, logits.gather(1, local.unsqueeze(1)).squeeze(1), target_logits)
            new_max = torch.maximum(running_max, logits.max(dim=1).values)
            total = total * (running_max - new_max).exp() + logits.sub_(new_max.unsqueeze(1)).exp_().sum(dim=1)
            running_max = new_max
            del logits
            _trim_on_the_cpu(hidden)
        log_total = total.log()  # log_softmax is (x - max) - log(sum): the same roundings, in that order
        grad = None
        if with_grad:
            grad = torch.zeros(n, width, dtype=torch.float32, device=hidden.device)
            for start, end in pack.ranges(rows):
                weight = pack.rows(start, end)
                softmax = torch.nn.functional.linear(rows_in, weight).float()
                softmax.sub_(running_max.unsqueeze(1)).sub_(log_total.unsqueeze(1)).exp_()
                inside, local = _in_chunk(targets, start, end)
                softmax[inside.nonzero().squeeze(1), local[inside]] -= 1
                grad += (softmax.to(pack.dtype) @ weight).float()  # softmax - one-hot, times W
                del softmax, weight
                _trim_on_the_cpu(hidden)
            grad = grad.to(hidden.dtype)
        ctx.save_for_backward(grad)
        return (target_logits - running_max) - log_total


def _trim_on_the_cpu(hidden: torch.Tensor) -> None:
    """The heap's free pages back to the system where the chunks live in glibc's heap (a GPU's do not)."""
    if trims_heap(hidden.device.type):
        trim_heap()


def _in_chunk(targets: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which targets fall in the vocabulary chunk start..end, and their row in it (clamped elsewhere)."""
    return (targets >= start) & (targets < end), (targets - start).clamp(0, end - start - 1)


def token_logps(hidden: torch.Tensor, weight, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[i] | hidden[i]) in float32, for rows of hidden (n, H), output weights (V, H): a
    tensor, or a packed output layer's PackedRows (quantized_vocab.py)."""
    with_grad = torch.is_grad_enabled() and hidden.requires_grad
    function = _ChunkedTokenLogps if isinstance(weight, torch.Tensor) else _VocabChunkedTokenLogps
    return function.apply(hidden, weight, targets, with_grad)


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


def mean_logit_per_position(hidden: torch.Tensor, weight: torch.Tensor | PackedRows) -> torch.Tensor:
    """The mean over the vocabulary of each position's logits, (batch, seq), without the logits:
    mean_v (h . W_v) = h . mean_v W_v. DPO logs the mean of these as logits/chosen and logits/rejected.
    The mean row is summed in float32 a chunk of rows at a time: summed whole, the output layer is
    first copied to float32 (113 MB for SmolLM2's, 2.2 GB for Qwen2.5-7B's), in every DPO forward."""
    with torch.no_grad():
        if isinstance(weight, torch.Tensor):
            chunks = weight.split(max(1, MEAN_ROW_CHUNK_BYTES // (4 * weight.size(1))))
        else:  # packed: its own chunks of rows, dequantized one at a time
            chunks = (chunk for _, _, chunk in weight.chunks())
        mean_row = sum(chunk.sum(dim=0, dtype=torch.float32) for chunk in chunks) / weight.shape[0]
        return hidden.float() @ mean_row


def output_weight(model: torch.nn.Module) -> tuple[torch.Tensor | PackedRows | None, str]:
    """The frozen output weights of a supported causal LM (packed ones as they are), or None and why
    the lean path cannot run."""
    inner = _causal_lm(model)
    model_type = getattr(getattr(inner, "config", None), "model_type", None)
    if model_type not in LEAN_MODEL_TYPES:
        return None, f"model type {model_type} is not one of {', '.join(LEAN_MODEL_TYPES)}"
    head = inner.get_output_embeddings()
    if isinstance(head, PackedOutput):
        return head.pack, ""
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
    1.7 GB beside the step's activations). A packed output layer (quantize_embeddings) skips even the
    last position's logits, which would dequantize all its rows."""
    caught: list[torch.Tensor] = []
    hook = _final_norm(model).register_forward_hook(lambda module, args, output: caught.append(output))
    head = _causal_lm(model).get_output_embeddings()
    held_out = not model.training
    if held_out:
        _trim_on_the_cpu(inputs["input_ids"])
    try:
        with head.skipped() if isinstance(head, PackedOutput) else contextlib.nullcontext():
            model(**inputs, return_dict=True, use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    if held_out:
        _trim_on_the_cpu(caught[-1])
    return caught[-1]


def _final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The norm the LEAN_MODEL_TYPES apply last, whose output is the last hidden state."""
    return _causal_lm(model).model.norm


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside DistributedDataParallel and peft."""
    from peft import PeftModel

    inner = model.module if hasattr(model, "module") else model
    return inner.get_base_model() if isinstance(inner, PeftModel) else inner
