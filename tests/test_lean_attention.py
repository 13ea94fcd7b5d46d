"""Lean attention against SDPA: the same outputs and gradients, with fewer bytes.

SDPA runs on its math backend here: what MPS runs, and on the CPU the stand-in for it.
"""

import json
import math

import pytest
import torch
import yaml
from conftest import run_mpskit
from torch.nn.attention import SDPBackend, sdpa_kernel

from mpskit.engine.lean_attention import NAME, LeanAttention, attention_mask, lean_attention
from mpskit.plan.memory import LEAN_MODEL_TYPES

DEVICES = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
# (batch, query heads, kv heads, length, rows per block): one position; one block; several blocks
# with a length that is not a multiple of the block; Qwen2.5's 14 query heads on 2 kv heads
SHAPES = [(1, 4, 2, 1, None), (4, 4, 4, 48, None), (1, 14, 2, 37, 5), (4, 14, 2, 50, 16)]


def padding_for(kind: str, batch: int, length: int) -> torch.Tensor | None:
    """True for real tokens: none, right padding, left padding, or rows of very different lengths."""
    if kind == "none":
        return None
    mask = torch.ones(batch, length, dtype=torch.bool)
    for row in range(1, batch):
        cut = max(1, length * row // (batch + 1) if kind == "ragged" else length // 3)
        if kind == "left":
            mask[row, :cut] = False
        else:
            mask[row, cut:] = False
    return mask


def sdpa(query, key, value, scaling, padding=None, full_mask=None):
    """transformers' SDPA call on the math backend, k and v repeated as transformers repeats them."""
    groups = query.size(1) // key.size(1)
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    queries, keys = query.size(2), key.size(2)
    mask = full_mask
    if mask is None:
        mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)[None, None]
        if padding is not None:
            mask = mask & padding[:, None, None, :]
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2)


def outputs_and_grads(attend, inputs, upstream):
    inputs = [tensor.detach().clone().requires_grad_() for tensor in inputs]
    out = attend(*inputs)
    (out.float() * upstream).sum().backward()
    return [out.detach().float()] + [tensor.grad.float() for tensor in inputs]


def random_inputs(batch, heads, kv_heads, length, dtype, device, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, length, dim), (batch, kv_heads, length, dim), (batch, kv_heads, length, dim)]
    inputs = [torch.randn(shape, generator=generator).to(device, dtype) for shape in shapes]
    return inputs, torch.randn(batch, length, heads, dim, generator=generator).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding_kind", ["none", "right", "left", "ragged"])
@pytest.mark.parametrize("shape", SHAPES)
def test_outputs_and_gradients_equal_sdpa_in_float32(device, padding_kind, shape):
    batch, heads, kv_heads, length, rows = shape
    inputs, upstream = random_inputs(batch, heads, kv_heads, length, torch.float32, device)
    padding = padding_for(padding_kind, batch, length)
    padding = None if padding is None else padding.to(device)
    scaling = 16**-0.5
    lean = outputs_and_grads(lambda q, k, v: lean_attention(q, k, v, scaling=scaling, padding=padding, rows=rows),
                             inputs, upstream)  # fmt: skip
    plain = outputs_and_grads(lambda q, k, v: sdpa(q, k, v, scaling, padding), inputs, upstream)
    for name, got, expected in zip(("output", "grad q", "grad k", "grad v"), lean, plain, strict=True):
        # near zero, relative to the inputs' scale (about 1): at s = 1 the gradients of q and k are 0,
        # and lean attention's are float32 rounding of dP - dO.O (3e-7)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * max(float(expected.abs().max()), 1.0),
                                   msg=name)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES[2:])
def test_bf16_is_as_close_to_float32_as_sdpa_in_bf16(device, shape):
    """In bf16 both round; lean attention's error against float32 is SDPA's own, give or take."""
    batch, heads, kv_heads, length, rows = shape
    inputs, upstream = random_inputs(batch, heads, kv_heads, length, torch.float32, device, seed=1)
    padding = padding_for("left", batch, length).to(device)
    exact = outputs_and_grads(lambda q, k, v: sdpa(q, k, v, 0.25, padding), inputs, upstream)
    half = [tensor.bfloat16() for tensor in inputs]
    lean = outputs_and_grads(lambda q, k, v: lean_attention(q, k, v, scaling=0.25, padding=padding, rows=rows),
                             half, upstream)  # fmt: skip
    plain = outputs_and_grads(lambda q, k, v: sdpa(q, k, v, 0.25, padding), half, upstream)
    for name, got, rounded, expected in zip(("output", "grad q", "grad k", "grad v"), lean, plain, exact, strict=True):
        scale = float(expected.abs().max())
        assert float((got - expected).abs().max()) <= 2 * float((rounded - expected).abs().max()) + 4e-3 * scale, name
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-2 * scale, msg=name)


def test_a_four_dimensional_mask_is_taken_as_given():
    """Packed sequences (block-diagonal, boolean) and an additive float mask, as collators build them."""
    inputs, upstream = random_inputs(2, 4, 2, 20, torch.float32, "cpu")
    causal = torch.ones(20, 20, dtype=torch.bool).tril()
    packed = causal.clone()
    packed[12:, :12] = False  # a second sequence starts at position 12
    boolean = torch.stack([causal, packed])[:, None]
    additive = torch.zeros(boolean.shape).masked_fill(~boolean, torch.finfo(torch.float32).min)
    per_head = boolean.expand(2, 4, 20, 20).clone()
    per_head[:, 1, :, :3] = False  # one head may not see the first positions
    for mask in (boolean, additive, per_head):
        lean = outputs_and_grads(lambda q, k, v, m=mask: lean_attention(q, k, v, scaling=0.25, full_mask=m, rows=6),
                                 inputs, upstream)  # fmt: skip
        plain = outputs_and_grads(lambda q, k, v, m=mask: sdpa(q, k, v, 0.25, full_mask=m), inputs, upstream)
        for got, expected in zip(lean, plain, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


def test_the_mask_transformers_hands_over_is_the_padding_mask_itself():
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    padding = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    assert attention_mask(2, 4, 4, attention_mask=torch.ones(2, 4, dtype=torch.long)) is None
    assert torch.equal(attention_mask(2, 4, 4, attention_mask=padding), padding.bool())
    window = sliding_window_causal_mask_function(2)
    expected = sdpa_mask(2, 4, 4, mask_function=window, attention_mask=padding.bool())
    assert torch.equal(attention_mask(2, 4, 4, mask_function=window, attention_mask=padding.bool()), expected)


def tiny_qwen(attention: str = "sdpa", model_type: str = "qwen2", **config):
    """A 2-layer random model of MODEL_TYPE (Qwen2 unless named), 64 wide."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    shape = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 300, "head_dim": 16, **config}  # fmt: skip
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, attn_implementation=attention, **shape))


@pytest.mark.parametrize("model_type", LEAN_MODEL_TYPES)
def test_through_each_supported_model_with_lora_every_gradient_equals_sdpa(capsys, model_type):
    """A 2-layer model of each type the lean paths accept, LoRA on every linear layer: loss and LoRA
    gradients, three paddings."""
    import copy

    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"], init_lora_weights=False)  # fmt: skip
    plain = get_peft_model(tiny_qwen(model_type=model_type), lora)
    lean = copy.deepcopy(plain)
    attention = LeanAttention(True)
    attention.install(lean)
    assert lean.get_base_model().config._attn_implementation == NAME
    ids = torch.randint(0, 300, (4, 40), generator=torch.Generator().manual_seed(2))
    for kind in ("right", "left", "ragged"):
        mask = padding_for(kind, 4, 40).long()
        results = []
        for model in (plain, lean):
            model.zero_grad()
            with sdpa_kernel(SDPBackend.MATH):
                loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
            loss.backward()
            grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
            results.append((loss.item(), grads))
        (plain_loss, plain_grads), (lean_loss, lean_grads) = results
        assert lean_loss == pytest.approx(plain_loss, rel=1e-5), kind
        assert plain_grads.keys() == lean_grads.keys() and all("lora" in name for name in plain_grads)
        for name, grad in plain_grads.items():
            torch.testing.assert_close(lean_grads[name], grad, rtol=1e-5, atol=1e-5 * float(grad.abs().max()))
    assert attention.report == {"asked": True, "training": "lean", "fallbacks": []}
    assert "lean attention off" not in capsys.readouterr().err


def test_what_it_does_not_do_goes_to_sdpa_and_is_said_once(capsys):
    model = tiny_qwen(attention_dropout=0.1)
    attention = LeanAttention(True)
    attention.install(model)
    ids = torch.randint(0, 300, (2, 12))
    model.train()
    for _ in range(2):
        model(input_ids=ids).logits.sum().backward()
    assert attention.report == {"asked": True, "training": "sdpa", "fallbacks": ["dropout above 0"]}
    model.eval()  # no dropout in evaluation: lean there
    reference = tiny_qwen(attention_dropout=0.1).eval()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert capsys.readouterr().err.count("lean attention off for dropout above 0") == 1


def test_soft_capping_sinks_and_an_unmasked_window_go_to_sdpa(capsys):
    """Each hands the call to transformers' SDPA with the padding mask made 4-D, and is said once."""
    inputs, _ = random_inputs(2, 4, 2, 12, torch.float32, "cpu")
    padding = padding_for("left", 2, 12)
    module = tiny_qwen().model.layers[0].self_attn
    attention = LeanAttention(True)
    expected = sdpa(*inputs, 0.25, padding)
    for kwargs in ({"softcap": 30.0}, {"s_aux": torch.zeros(4)}, {"sliding_window": 4}, {"softcap": 30.0}):
        with sdpa_kernel(SDPBackend.MATH):
            out, _ = attention.forward(module, *inputs, padding, scaling=0.25, **kwargs)
        torch.testing.assert_close(out, expected)
    assert attention.report == {"asked": True, "training": "sdpa",
                                "fallbacks": ["soft-capping", "attention sinks",
                                              "a sliding window shorter than the sequence"]}  # fmt: skip
    assert capsys.readouterr().err.count("lean attention off for soft-capping") == 1
    out, _ = attention.forward(module, *inputs, padding, scaling=0.25, sliding_window=12)  # no shorter than s
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_an_unsupported_model_type_keeps_its_own_attention(capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    attention = LeanAttention(True)
    attention.install(model)
    assert model.config._attn_implementation != NAME
    assert attention.report["training"] == "sdpa" and "model type gpt2" in attention.report["fallbacks"][0]
    assert "lean attention off for model type gpt2" in capsys.readouterr().err
    off = LeanAttention(False)
    qwen = tiny_qwen()
    off.install(qwen)
    assert qwen.config._attn_implementation == "sdpa" and off.report == {"asked": False, "training": None,
                                                                         "fallbacks": []}  # fmt: skip


def test_the_block_budget_bounds_the_scores():
    from mpskit.engine.lean_attention import block_rows
    from mpskit.plan.memory import attention_block_bytes

    rows = block_rows(2, 14, 4096, "cpu")
    assert 4 * 2 * 14 * 4096 * rows <= attention_block_bytes("cpu") < 4 * 2 * 14 * 4096 * (rows + 1)
    assert block_rows(2, 14, 4096, "mps") > rows  # larger blocks on a GPU: fewer kernel launches
    assert block_rows(64, 64, 10**6, "cpu") == 1


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["sft", "dpo", "foodpo"])
def test_a_run_logs_the_losses_of_the_run_without_it(tmp_path, tiny_model, stage):
    """`mpskit train` with lean_attention=true against lean_attention=false (the CPU's SDPA): the
    same loss and metrics at every step, float32; the YAML leaves the key out; mpskit.json says what ran."""
    from test_e2e import FAST
    from test_lean_logits import TIMING_KEYS

    short = ["max_steps=6", "logging_steps=1", "eval_strategy=no", "save_steps=1000", "bf16=false"]
    scale = ["pref_beta_scale=0.5"] if stage == "foodpo" else []
    words = [f"preset={stage}", f"model_name_or_path={tiny_model}", *FAST, *short, *scale]
    rows = {}
    for lean in ("true", "false"):
        result = run_mpskit("train", *words, f"run_name={lean}", f"lean_attention={lean}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        run_dir = (tmp_path / "output" / lean / "latest").resolve()
        record = json.loads((run_dir / "mpskit.json").read_text())
        expected = {"asked": lean == "true", "training": "lean" if lean == "true" else None, "fallbacks": []}
        assert record["attempts"][-1]["lean_attention"] == expected
        assert "lean_attention" not in yaml.safe_load((run_dir / "llamafactory.yaml").read_text())
        logged = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
        rows[lean] = [row for row in logged if "loss" in row]
    assert len(rows["true"]) == 6 and all(math.isfinite(row["loss"]) for row in rows["true"])
    for lean_row, plain_row in zip(rows["true"], rows["false"], strict=True):
        shared = [key for key in plain_row if isinstance(plain_row[key], float) and key not in TIMING_KEYS]
        assert "loss" in shared and (stage == "sft" or "rewards/margins" in shared)
        for key in shared:
            tolerance = {"rel": 1e-5} if key == "loss" else {"rel": 1e-5, "abs": 1e-6}
            assert lean_row[key] == pytest.approx(plain_row[key], **tolerance), (key, lean_row["current_steps"])
