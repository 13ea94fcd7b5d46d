"""fooDPO on the real LLaMA-Factory DPO trainer: beta, gradients, perplexity, forward passes."""

import math

import pytest
import torch
from conftest import ROOT

from mpskit.errors import MpskitError
from mpskit.settings.foodpo import FooDPOConfig, split_foodpo_args

pytestmark = pytest.mark.xdist_group(__name__)

IGNORE = -100


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"pref_loss": "kto_pair"}, "pref_loss 'kto_pair'"),
        ({"pref_loss": "orpo", "foodpo_ppl_source": "reference"}, "needs a reference model"),
        ({"pref_beta_scale": -1}, "pref_beta_scale"),
        ({"foodpo_beta_min": 0.5, "foodpo_beta_max": 0.1}, "above"),
        ({"foodpo_ppl_source": "ref"}, "policy or reference"),
    ],
)
def test_bad_foodpo_settings_are_refused(extra, needle):
    with pytest.raises(MpskitError, match=needle):
        split_foodpo_args({"stage": "foodpo", "pref_beta": 0.1, **extra})


def test_foodpo_args_become_llamafactory_dpo():
    lf_args, config = split_foodpo_args({"stage": "foodpo", "pref_beta_scale": 0.05, "foodpo_beta_max": 1})
    assert lf_args == {"stage": "dpo"}
    assert config == FooDPOConfig(pref_beta_scale=0.05, beta_max=1.0)


def trainer_args(tiny_model, tmp_path) -> dict:
    return {
        "model_name_or_path": str(tiny_model),
        "template": "qwen",
        "stage": "dpo",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_target": "all",
        "lora_rank": 8,
        "pref_beta": 0.1,
        "dataset_dir": str(ROOT / "data"),
        "dataset": "demo_pref",
        "cutoff_len": 128,
        "per_device_train_batch_size": 4,
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "report_to": "none",
        "seed": 0,
    }


@pytest.fixture(scope="module")
def trainers(tiny_model, tmp_path_factory):
    from mpskit.engine.trainer_builders import build_dpo_trainer

    args = trainer_args(tiny_model, tmp_path_factory.mktemp("foodpo"))
    foo = build_dpo_trainer(args, FooDPOConfig(pref_beta_scale=0.5))
    dpo = build_dpo_trainer(args)
    dpo.model = foo.model  # one set of weights for both
    batch = next(iter(foo.get_train_dataloader()))
    return foo, dpo, batch


def trainable_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def computed_beta(foo, batch) -> torch.Tensor:
    from mpskit.engine.foodpo_trainer import dynamic_beta, prompt_log_perplexity

    half = batch["input_ids"].size(0) // 2
    with torch.no_grad():
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = foo.model(**inputs).logits.float()[:half]
    log_ppl = prompt_log_perplexity(
        logits, batch["labels"][:half], batch["attention_mask"][:half], inputs["input_ids"][:half]
    )
    return dynamic_beta(log_ppl, foo.beta, foo.foodpo)


def test_no_gradient_flows_through_beta(trainers):
    foo, dpo, batch = trainers
    model = foo.model
    model.zero_grad()
    foo_loss, metrics = foo.get_batch_loss_metrics(model, dict(batch))
    foo_loss.backward()
    foo_grads = trainable_grads(model)

    beta = computed_beta(foo, batch)
    assert beta.shape == (batch["input_ids"].size(0) // 2,) and metrics["dynamic_beta"] == pytest.approx(
        beta.mean().item()
    )
    model.zero_grad()
    dpo.beta = beta  # each pair's beta held fixed at fooDPO's value
    dpo_loss, _ = dpo.get_batch_loss_metrics(model, dict(batch))
    dpo.beta = 0.1
    dpo_loss.backward()
    dpo_grads = trainable_grads(model)

    assert foo_loss.item() == pytest.approx(dpo_loss.item(), abs=1e-7)
    assert foo_grads.keys() == dpo_grads.keys() and foo_grads
    for name, grad in foo_grads.items():
        torch.testing.assert_close(grad, dpo_grads[name], rtol=1e-5, atol=1e-8, msg=name)
    assert any(g.abs().sum() > 0 for g in foo_grads.values())


def test_forward_passes_per_step_equal_plain_dpo(trainers):
    foo, dpo, batch = trainers
    calls = []
    handle = foo.model.get_base_model().model.register_forward_hook(lambda *_: calls.append(1))
    try:
        counts = {}
        for name, trainer in (("dpo", dpo), ("foodpo", foo)):
            calls.clear()
            trainer.get_batch_loss_metrics(trainer.model, dict(batch))[0].backward()
            counts[name] = len(calls)
    finally:
        handle.remove()
    assert counts["foodpo"] == counts["dpo"] == 2  # policy + reference (adapter disabled)


def test_prompt_perplexity_matches_plain_transformers(tiny_model):
    """Padding on both sides, and a real token with id 0 (the pad id too) inside a prompt."""
    from transformers import AutoModelForCausalLM

    from mpskit.engine.foodpo_trainer import prompt_log_perplexity

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    rows = [  # (prompt, response, left pad, right pad)
        ([5, 0, 17, 9, 30], [33, 44, 2], 0, 3),
        ([7, 8, 0, 12], [21, 22], 3, 2),
        ([40, 41], [50, 51, 52, 53], 2, 3),
    ]
    ids, labels, mask = [], [], []
    for prompt, response, left, right in rows:
        ids.append([0] * left + prompt + response + [0] * right)
        labels.append([IGNORE] * (left + len(prompt)) + response + [IGNORE] * right)
        mask.append([0] * left + [1] * (len(prompt) + len(response)) + [0] * right)
    ids, labels, mask = torch.tensor(ids), torch.tensor(labels), torch.tensor(mask)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    got = prompt_log_perplexity(logits, labels, mask, ids)

    expected = []
    for prompt, _, _, _ in rows:
        with torch.no_grad():
            prompt_logits = model(input_ids=torch.tensor([prompt])).logits[0]
        logprobs = torch.log_softmax(prompt_logits[:-1].double(), dim=-1)
        nll = -logprobs[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        expected.append(nll.mean().item())
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-4, atol=1e-4)
    assert all(math.isfinite(x) and x > 0 for x in got.tolist())
