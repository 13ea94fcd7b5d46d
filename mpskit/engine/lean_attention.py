"""Exact attention that never holds the heads x s x s matrices: queries a block at a time.

On MPS, PyTorch's `scaled_dot_product_attention` takes its math path for every shape: it keeps the
float32 batch x heads x s x s probabilities of every layer for the backward, which is what stops
long contexts on a Mac once lean logits are on. This attention computes the same function a block
of query positions at a time: the block's scores against the keys it may see (causal: none past
the block's last position), a float32 softmax, times V. It keeps the per-row log-sum-exp instead
of the probabilities, and the backward recomputes one block's probabilities at a time, so at most
one block's scores exist at once in the forward and in the backward (the memory-efficient attention
of Rabe and Staats, 2021, with FlashAttention's saved log-sum-exp). Grouped-query attention is done
by letting each key/value head serve its group of query heads as extra rows, so keys and values are
never repeated. Pure PyTorch: it runs on MPS, CUDA and the CPU alike.

It reaches the models through transformers' AttentionInterface under `NAME`, with a mask function
that hands it the padding mask as it is (batch x keys) instead of a 4-D one; a 4-D mask (packed
sequences, a cache) is taken as given. A call it does not do (a sliding window shorter than the
sequence, soft-capping, attention sinks, dropout) goes to SDPA, said once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# LEAN_MODEL_TYPES (the memory model's table): their attention layers call the attention interface with
# q, k, v, a causal mask and `scaling` only (Qwen2/Qwen3 and Mistral add a sliding window, checked per call).
from mpskit.engine.lean_switch import LeanSwitch
from mpskit.plan.memory import LEAN_MODEL_TYPES, attention_block_bytes

NAME = "mpskit_lean"


def block_rows(batch: int, heads: int, keys: int, device: str) -> int:
    """Query positions per block: its float32 scores (batch x heads x rows x keys) fit the device's
    block budget (the memory model counts the same one)."""
    return max(1, attention_block_bytes(device) // (4 * batch * heads * max(keys, 1)))


@dataclass
class _Masks:
    """What a block may see: the causal rule (queries are the last positions: `offset` keys before
    the first), a padding mask (batch x keys, True = a real token), or a 4-D mask as transformers or
    a collator built it (boolean, or additive floats)."""

    offset: int
    causal: bool
    padding: torch.Tensor | None
    full_mask: torch.Tensor | None
    groups: int  # query heads per key/value head

    def apply(self, scores: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """scores (batch, kv heads, rows x groups, keys): masked in place, -inf where not seen."""
        batch, kv_heads, _, keys = scores.shape
        view = scores.view(batch, kv_heads, end - start, self.groups, keys)
        if self.causal:
            positions = torch.arange(start + self.offset, end + self.offset, device=scores.device)
            future = torch.arange(keys, device=scores.device)[None, :] > positions[:, None]
            view.masked_fill_(future[:, None, :], float("-inf"))
        if self.padding is not None:
            view.masked_fill_(~self.padding[:, None, None, None, :keys], float("-inf"))
        if self.full_mask is not None:
            mask = self.full_mask[:, :, start:end, :keys]
            if mask.size(1) == 1:
                mask = mask[:, :, :, None, :]
            else:  # one mask per query head: head h = kv head * groups + g
                mask = mask.reshape(batch, kv_heads, self.groups, end - start, keys).transpose(2, 3)
            if mask.dtype == torch.bool:
                view.masked_fill_(~mask, float("-inf"))
            else:
                view.add_(mask)
        return scores

    def blocks(self, queries: int, keys: int, rows: int):
        """(first query, end query, keys the block sees) per block: causal, none past its last query."""
        for start in range(0, queries, rows):
            end = min(start + rows, queries)
            yield start, end, min(keys, end + self.offset) if self.causal else keys


def _block_scores(query_rows, key, masks: _Masks, start: int, end: int, keys: int, scaling: float) -> torch.Tensor:
    """float32 (batch, kv heads, rows x groups, keys) scaled scores of one block, masked."""
    rows = query_rows[:, :, start:end].flatten(2, 3)
    scores = torch.matmul(rows, key[:, :, :keys].transpose(-1, -2)).to(_softmax_dtype(key)).mul_(scaling)
    return masks.apply(scores, start, end)


def _softmax_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32 for 16-bit inputs (as SDPA's math path), float64 kept."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _rows_layout(tensor: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(batch, heads, seq, d) -> (batch, kv heads, seq, groups, d): each block's rows are one slice."""
    batch, heads, seq, dim = tensor.shape
    return tensor.view(batch, kv_heads, heads // kv_heads, seq, dim).transpose(2, 3).contiguous()


class _LeanAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, masks: _Masks, scaling: float, rows: int):
        batch, heads, queries, _ = query.shape
        kv_heads, keys = key.size(1), key.size(2)
        groups = heads // kv_heads
        query_rows = _rows_layout(query, kv_heads)
        key, value = key.contiguous(), value.contiguous()
        # the output as the model wants it, (batch, seq, heads, d): the block's rows written in place
        out = value.new_empty(batch, queries, kv_heads, groups, value.size(-1))
        lse = torch.empty(batch, kv_heads, queries, groups, dtype=_softmax_dtype(key), device=query.device)
        for start, end, seen in masks.blocks(queries, keys, rows):
            scores = _block_scores(query_rows, key, masks, start, end, seen, scaling)
            peak = scores.amax(-1, keepdim=True)
            peak.masked_fill_(peak == float("-inf"), 0)  # a row that sees nothing: output 0, as SDPA's
            probabilities = scores.sub_(peak).exp_()
            total = probabilities.sum(-1, keepdim=True)
            probabilities.div_(total.masked_fill(total == 0, 1))
            block = torch.matmul(probabilities.to(value.dtype), value[:, :, :seen])
            del scores, probabilities
            out[:, start:end] = block.view(batch, kv_heads, end - start, groups, -1).transpose(1, 2)
            lse[:, :, start:end] = (peak + total.log()).view(batch, kv_heads, end - start, groups)
        ctx.save_for_backward(query_rows, key, value, out, lse)
        ctx.masks, ctx.scaling, ctx.rows = masks, scaling, rows
        return out.view(batch, queries, heads, -1)

    @staticmethod
    def backward(ctx, grad_out):
        query_rows, key, value, out, lse = ctx.saved_tensors
        masks, scaling = ctx.masks, ctx.scaling
        batch, kv_heads, queries, groups, _ = query_rows.shape
        keys = key.size(2)
        grad_rows = grad_out.reshape(out.shape).transpose(1, 2)  # (batch, kv heads, seq, groups, d)
        out_rows = out.transpose(1, 2)
        # the softmax's row term, sum_j P dP = dO . O, per query row
        wide = _softmax_dtype(key)
        delta = (grad_rows.to(wide) * out_rows.to(wide)).sum(-1)
        lse = lse.masked_fill(lse == float("-inf"), float("inf"))  # rows that saw nothing: P = 0
        grad_query = torch.empty_like(query_rows)
        grad_key = torch.zeros(key.shape, dtype=wide, device=key.device)
        grad_value = torch.zeros(value.shape, dtype=wide, device=value.device)
        for start, end, seen in masks.blocks(queries, keys, ctx.rows):
            scores = _block_scores(query_rows, key, masks, start, end, seen, scaling)
            probabilities = scores.sub_(lse[:, :, start:end].flatten(2, 3).unsqueeze(-1)).exp_()
            grad_block = grad_rows[:, :, start:end].flatten(2, 3)
            grad_value[:, :, :seen] += torch.matmul(probabilities.to(value.dtype).transpose(-1, -2), grad_block)
            grad_scores = torch.matmul(grad_block, value[:, :, :seen].transpose(-1, -2)).to(wide)
            grad_scores.sub_(delta[:, :, start:end].flatten(2, 3).unsqueeze(-1)).mul_(probabilities).mul_(scaling)
            del scores, probabilities
            grad_scores = grad_scores.to(key.dtype)
            block_queries = query_rows[:, :, start:end]
            grad_key[:, :, :seen] += torch.matmul(grad_scores.transpose(-1, -2), block_queries.flatten(2, 3))
            grad_query[:, :, start:end] = torch.matmul(grad_scores, key[:, :, :seen]).view(block_queries.shape)
        grad_query = grad_query.transpose(2, 3).reshape(batch, kv_heads * groups, queries, -1)
        return grad_query, grad_key.to(key.dtype), grad_value.to(value.dtype), None, None, None


def lean_attention(query, key, value, *, scaling: float, causal: bool = True, padding=None, full_mask=None,
                   rows: int | None = None) -> torch.Tensor:  # fmt: skip
    """Attention of query (batch, heads, s_q, d) over key and value (batch, kv heads, s_k, d), as
    (batch, s_q, heads, d). `padding` (batch, s_k): True for a real token; `full_mask` (batch, 1 or
    heads, s_q, s_k): boolean (True = seen) or additive. Causal queries are the last s_q positions."""
    batch, heads, queries, _ = query.shape
    keys = key.size(2)
    masks = _Masks(keys - queries, causal and full_mask is None, padding, full_mask, heads // key.size(1))
    rows = rows or block_rows(batch, heads, keys, query.device.type)
    return _LeanAttention.apply(query, key, value, masks, scaling, rows)


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                   mask_function=None, attention_mask=None, **kwargs):  # fmt: skip
    """transformers' mask for this attention: for the plain causal mask of a whole sequence, the
    padding mask as it is (batch x keys; None without padding) instead of a 4-D one; anything else
    (packed sequences, a sliding window, a cache) as SDPA's 4-D mask."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    mask_function = mask_function or causal_mask_function
    if mask_function is causal_mask_function and q_offset == kv_offset == 0 and q_length == kv_length:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        return None if padding is None or bool(padding.all()) else padding.bool()
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, **kwargs)


class LeanAttention(LeanSwitch):
    """The lean-attention switch of one run and what actually ran, for mpskit.json. `install` sets it
    on a loaded model; every call then comes to `forward`, registered with transformers under NAME."""

    name, instead, plain = "lean attention", "SDPA", "sdpa"

    def install(self, model: torch.nn.Module) -> None:
        """Make the model (under peft and DDP) attend through `forward`, where its type allows."""
        if not self.enabled:
            return
        from peft import PeftModel
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        inner = model.module if hasattr(model, "module") else model  # DistributedDataParallel
        if isinstance(inner, PeftModel):
            inner = inner.get_base_model()
        model_type = getattr(getattr(inner, "config", None), "model_type", None)
        if model_type not in LEAN_MODEL_TYPES:
            self.fall_back(f"model type {model_type} is not one of {', '.join(LEAN_MODEL_TYPES)}", training=True)
            return
        AttentionInterface.register(NAME, self.forward)
        AttentionMaskInterface.register(NAME, attention_mask)
        inner.set_attn_implementation(NAME)

    def forward(self, module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                sliding_window: int | None = None, softcap: float | None = None, s_aux=None, **kwargs):  # fmt: skip
        """transformers' attention-function signature: (output (batch, s, heads, d), no weights)."""
        full = attention_mask is not None and attention_mask.dim() == 4
        # a sliding window that binds comes inside the 4-D mask transformers builds for its layers
        window = not full and sliding_window is not None and sliding_window < key.size(2)
        why = (
            "dropout above 0" if dropout and module.training
            else "soft-capping" if softcap
            else "attention sinks" if s_aux is not None
            else "a sliding window shorter than the sequence" if window
            else ""
        )  # fmt: skip
        if why:
            self.fall_back(why, module.training)
            return _sdpa(module, query, key, value, attention_mask, dropout, scaling, s_aux=s_aux, **kwargs)
        self.used(module.training)
        causal = kwargs.get("is_causal") if kwargs.get("is_causal") is not None else getattr(module, "is_causal", True)
        output = lean_attention(
            query, key, value, scaling=scaling if scaling is not None else query.size(-1) ** -0.5, causal=causal,
            padding=None if full else attention_mask, full_mask=attention_mask if full else None,
        )  # fmt: skip
        return output, None


def _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs):
    """transformers' own SDPA call, with a padding mask from `attention_mask` made 4-D for it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and attention_mask.dim() == 2:
        queries, keys = query.size(2), key.size(2)
        causal = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
        attention_mask = causal[None, None] & attention_mask[:, None, None, :]
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
