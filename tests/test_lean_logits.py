"""Lean logits against LLaMA-Factory's own path: the same losses, metrics and LoRA gradients.

On a random-initialised 2-layer model with Qwen's 151,936-token vocabulary, so the chunked pass
really runs in several chunks, and with batches padded on the right, on the left, and with rows of
very different lengths.
"""

import functools
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, run_mpskit

from mpskit.plan.memory import LEAN_MODEL_TYPES
from mpskit.settings.foodpo import FooDPOConfig

pytestmark = pytest.mark.xdist_group(__name__)

IGNORE = -100
QWEN_VOCAB = 151936
# what differs between two runs of the same training: wall time, memory, progress
# measured (times, memory) or planned (the memory prediction differs by path): not a training result
TIMING_KEYS = {"elapsed_time", "remaining_time", "throughput", "total_tokens", "percentage",
               "train_runtime", "train_tokens_per_second", "tokens_per_s", "eta_s", "memory_training_gb",
               "memory_predicted_gb"}  # fmt: skip
# On a CUDA machine the same comparisons run there too (the trainers below then train on the GPU).
DEVICES = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.parametrize("device", DEVICES)
def test_token_logps_and_gradient_match_log_softmax(monkeypatch, device):
    from mpskit.engine import lean_logits

    monkeypatch.setattr(lean_logits, "CHUNK_BYTES", 4 * 3000 * 37)  # 37 positions a chunk: 14 chunks
    torch.manual_seed(0)
    hidden = torch.randn(500, 64, dtype=torch.float64, device=device, requires_grad=True)
    weight = torch.randn(3000, 64, dtype=torch.float64, device=device) * 0.1
    targets = torch.randint(0, 3000, (500,), device=device)
    upstream = torch.randn(500, dtype=torch.float64, device=device)

    lean = lean_logits.token_logps(hidden, weight, targets)
    (lean * upstream).sum().backward()
    lean_grad, hidden.grad = hidden.grad, None
    plain = (hidden @ weight.T).float().log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
    (plain * upstream.float()).sum().backward()

    torch.testing.assert_close(lean, plain, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(lean_grad, hidden.grad, rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # no gradient kept when none is asked for
        torch.testing.assert_close(lean_logits.token_logps(hidden, weight, targets), plain.detach())


def test_mean_logit_per_position_is_the_mean_of_the_logits():
    from mpskit.engine.lean_logits import mean_logit_per_position

    torch.manual_seed(1)
    hidden, weight = torch.randn(2, 5, 16), torch.randn(700, 16)
    torch.testing.assert_close(mean_logit_per_position(hidden, weight), (hidden @ weight.T).mean(-1))


def _high_water_mark() -> int:
    with open("/proc/self/status") as status:
        return 1024 * int(next(line for line in status if line.startswith("VmHWM:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's resettable high-water mark")
def test_the_mean_row_is_summed_without_a_float32_copy_of_the_output_layer():
    """Summed whole, a 16-bit output layer is copied to float32 first: 2.2 GB for Qwen2.5-7B's, in every
    DPO forward. Here a 64 MiB bf16 table, whose copy would be 128 MiB."""
    from mpskit.engine.lean_logits import mean_logit_per_position
    from mpskit.engine.quantized import trim_heap

    weight, hidden = torch.randn(65536, 512).to(torch.bfloat16), torch.randn(1, 4, 512).to(torch.bfloat16)
    expected = (hidden.float() @ weight.float().T).mean(-1)
    trim_heap()
    Path("/proc/self/clear_refs").write_text("5")
    before = _high_water_mark()
    means = mean_logit_per_position(hidden, weight)
    assert _high_water_mark() - before < 64 * 1024**2  # half the copy: a busy worker's heap moves too
    torch.testing.assert_close(means, expected, rtol=1e-4, atol=1e-4)


def test_a_held_out_forward_on_the_cpu_hands_the_heap_back_before_and_after(tiny_model, monkeypatch):
    """So that neither the last batch's logits nor the decoder's freed layer buffers are under the next
    logits (the held-out pass's peak is the larger of the two, as the plan counts it); a training
    forward, whose activations stay for the backward, is left alone."""
    from transformers import AutoModelForCausalLM

    from mpskit.engine import lean_logits

    trims = []
    monkeypatch.setattr(lean_logits, "trim_heap", lambda: trims.append(1))
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    inputs = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    hidden = lean_logits.final_hidden_states(model.train(), inputs)
    assert hidden.shape == (1, 4, model.config.hidden_size) and trims == []
    with torch.no_grad():
        torch.testing.assert_close(lean_logits.final_hidden_states(model.eval(), inputs), hidden)
    assert len(trims) == 2


@pytest.fixture(scope="module")
def qwen_vocab_model(tmp_path_factory):
    from mpskit.tools.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vocab") / "model", ROOT / "data", dims={"vocab_size": QWEN_VOCAB})


def trainer_args(model, tmp_path, stage: str) -> dict:
    from test_foodpo import trainer_args as dpo_trainer_args

    return {
        **dpo_trainer_args(model, tmp_path),
        "stage": stage,
        "dataset": "demo_pref" if stage == "dpo" else "demo_sft",
        "use_cpu": "cuda" not in DEVICES,
    }


def randomise_lora(model) -> None:
    """peft starts LoRA B at zero (every gradient of A zero, every reward 0): move off that point."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def padded_batches(batch: dict, pairs: bool) -> dict:
    """The collated batch (right-padded), the same rows left-padded, and rows cut to very different lengths."""
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    left = {key: torch.zeros_like(value) for key, value in batch.items()}
    left["labels"].fill_(IGNORE)
    for row in range(ids.size(0)):
        length = int(mask[row].sum())
        for key, source in (("input_ids", ids), ("labels", labels), ("attention_mask", mask)):
            left[key][row, ids.size(1) - length :] = source[row, :length]
    ragged = {key: value.clone() for key, value in batch.items()}
    for row in range(ids.size(0)):
        keep = int(mask[row].sum())
        keep = keep if row % (ids.size(0) // 2 if pairs else 2) == 0 else max(keep // 3, 12)
        ragged["attention_mask"][row, keep:] = 0
        ragged["labels"][row, keep:] = IGNORE
        ragged["input_ids"][row, keep:] = 0
    return {"right": batch, "left": left, "ragged": ragged}


def loss_metrics_grads(trainer, run_step, batch) -> tuple[float, dict, dict]:
    model = trainer.model
    model.zero_grad()
    loss, metrics = run_step(trainer, model, trainer._prepare_inputs(dict(batch)))  # on the model's device
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return loss.item(), metrics, grads


def assert_same(plain, lean) -> None:
    (plain_loss, plain_metrics, plain_grads), (lean_loss, lean_metrics, lean_grads) = plain, lean
    assert lean_loss == pytest.approx(plain_loss, rel=1e-5)
    assert lean_metrics.keys() == plain_metrics.keys()
    for key, value in plain_metrics.items():
        assert lean_metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert lean_grads.keys() == plain_grads.keys() and any(g.abs().sum() > 0 for g in plain_grads.values())
    for name, grad in plain_grads.items():
        # near-zero elements: float32 sums in another order differ by ~1e-7 of the largest gradient
        atol = 1e-5 * float(grad.abs().max())
        torch.testing.assert_close(lean_grads[name], grad, rtol=1e-4, atol=atol, msg=name)


@pytest.mark.e2e
# make test: the reference's perplexity (the policy's runs in test_lean_run_logs_the_losses_of_the_plain_run)
@pytest.mark.parametrize("foodpo", [pytest.param(None, marks=pytest.mark.slow),
                                    pytest.param(FooDPOConfig(pref_beta_scale=0.5), marks=pytest.mark.slow),
                                    FooDPOConfig(0.5, ppl_source="reference")])  # fmt: skip
def test_dpo_and_foodpo_lean_equal_plain(qwen_vocab_model, tmp_path, foodpo):
    dpo_lean_equals_plain(qwen_vocab_model, tmp_path, foodpo)


def dpo_lean_equals_plain(model: Path, tmp_path: Path, foodpo: FooDPOConfig | None) -> None:
    from mpskit.engine.trainer_builders import build_dpo_trainer

    args = trainer_args(model, tmp_path, "dpo")
    plain = build_dpo_trainer(args, foodpo, lean=False)
    lean = build_dpo_trainer(args, foodpo, lean=True)
    randomise_lora(plain.model)
    lean.model = plain.model  # one set of weights for both

    def step(trainer, model, batch):
        return trainer.get_batch_loss_metrics(model, batch)

    for name, batch in padded_batches(next(iter(plain.get_train_dataloader())), pairs=True).items():
        expected, got = loss_metrics_grads(plain, step, batch), loss_metrics_grads(lean, step, batch)
        assert_same(expected, got)
        if foodpo is not None:
            assert got[1]["prompt_perplexity"] > 1 and got[1]["dynamic_beta"] > 0, name
    assert lean.lean.report == {"asked": True, "training": "lean", "fallbacks": []}


@pytest.fixture(scope="module")
def other_architecture(request, tmp_path_factory, tiny_model) -> Path:
    return model_of_type(request.param, tmp_path_factory.mktemp(request.param) / "model", tiny_model)


def model_of_type(model_type: str, folder: Path, tiny_model: Path) -> Path:
    """The tiny model's tokenizer under a random 2-layer model of another type the lean paths accept."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shutil.copytree(tiny_model, folder)
    tiny = json.loads((tiny_model / "config.json").read_text())
    shape = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "head_dim": 16, "vocab_size": tiny["vocab_size"],
             **{key: tiny[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if key in tiny}}  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **shape)).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == model_type
    return folder


# SFT for each architecture in make test, DPO for Qwen3 there and for the others in make test-all
ARCHITECTURE_CASES = [
    pytest.param(model_type, stage, marks=[pytest.mark.slow] if stage == "dpo" and model_type != "qwen3" else [])
    for model_type in LEAN_MODEL_TYPES if model_type != "qwen2" for stage in ("sft", "dpo")
]


@pytest.mark.e2e
@pytest.mark.parametrize(("other_architecture", "stage"), ARCHITECTURE_CASES, indirect=["other_architecture"])
def test_each_supported_architecture_lean_equals_plain(other_architecture, tmp_path, stage):
    """Qwen3, Llama and Mistral (Qwen2 above): the same losses, metrics and LoRA gradients on the lean path."""
    if stage == "sft":
        sft_lean_equals_plain(other_architecture, tmp_path)
    else:
        dpo_lean_equals_plain(other_architecture, tmp_path, None)


@pytest.mark.e2e
def test_a_llama_model_trains_end_to_end_on_both_lean_paths(tmp_path, tiny_model):
    llama = model_of_type("llama", tmp_path / "llama", tiny_model)
    words = ["train", "preset=dpo", f"model_name_or_path={llama}", "template=qwen", f"dataset_dir={ROOT / 'data'}",
             "max_steps=2", "cutoff_len=128", "eval_dataset=", "lean_attention=true", "run_name=llama"]  # fmt: skip
    result = run_mpskit(*words, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    attempt = json.loads((tmp_path / "output" / "llama" / "latest" / "mpskit.json").read_text())["attempts"][-1]
    assert attempt["outcome"] == "finished"
    assert attempt["lean_logits"]["training"] == "lean" and attempt["lean_attention"]["training"] == "lean"


def build_sft_trainer(args: dict, lean: bool):
    from mpskit.engine.lean_trainers import CustomSeq2SeqTrainer, LeanPath, LeanSFTTrainer
    from mpskit.engine.trainer_builders import build_trainer

    return build_trainer(args, functools.partial(LeanSFTTrainer, lean=LeanPath(True)) if lean else CustomSeq2SeqTrainer)


@pytest.mark.e2e
def test_sft_lean_equals_plain(qwen_vocab_model, tmp_path):
    sft_lean_equals_plain(qwen_vocab_model, tmp_path)


def sft_lean_equals_plain(model: Path, tmp_path: Path) -> None:
    args = trainer_args(model, tmp_path, "sft")
    plain, lean = build_sft_trainer(args, lean=False), build_sft_trainer(args, lean=True)
    randomise_lora(plain.model)
    lean.model = plain.model

    def step(trainer, model, batch):
        items = (batch["labels"] != IGNORE).sum() + 7  # as if part of a larger accumulated batch
        return trainer.compute_loss(model, batch, num_items_in_batch=items), {}

    for batch in padded_batches(next(iter(plain.get_train_dataloader())), pairs=False).values():
        assert_same(loss_metrics_grads(plain, step, batch), loss_metrics_grads(lean, step, batch))
    assert lean.lean.report["training"] == "lean"


@pytest.mark.e2e
def test_full_finetuning_falls_back_and_says_so(qwen_vocab_model, tmp_path, capsys):
    from mpskit.engine.trainer_builders import build_dpo_trainer

    args = {**trainer_args(qwen_vocab_model, tmp_path, "dpo"), "finetuning_type": "full", "pref_loss": "orpo"}
    args.pop("lora_target")
    trainer = build_dpo_trainer(args, lean=True)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.get_batch_loss_metrics(trainer.model, dict(batch))
    trainer.get_batch_loss_metrics(trainer.model, dict(batch))
    assert trainer.lean.report["training"] == "plain"
    assert capsys.readouterr().err.count("lean logits off for training: the output layer is trained") == 1


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["sft", "dpo", "foodpo"])
def test_lean_run_logs_the_losses_of_the_plain_run(tmp_path, tiny_model, stage):
    """`mpskit train` (lean logits, the default) against the same run on whole logits: plain
    `llamafactory-cli train` on the YAML mpskit wrote for sft and dpo, `lean_logits=false` for foodpo
    (and for every logged metric of dpo)."""
    from pathlib import Path

    from conftest import run_llamafactory_cli, run_mpskit
    from test_e2e import FAST

    # float32 (a CUDA plan would take bf16, where matrix products of different shapes round differently)
    short = ["max_steps=6", "logging_steps=1", "eval_strategy=no", "save_steps=1000", "bf16=false"]
    scale = ["pref_beta_scale=0.5"] if stage == "foodpo" else []
    words = [f"preset={stage}", f"model_name_or_path={tiny_model}", *FAST, *short, *scale]

    def mpskit_run(name: str, *extra: str) -> Path:
        result = run_mpskit("train", *words, f"run_name={name}", *extra, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        return (tmp_path / "output" / name / "latest").resolve()

    def logged(run_dir: Path) -> list[dict]:
        rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
        return [row for row in rows if "loss" in row]

    lean_dir = mpskit_run("lean")
    record = json.loads((lean_dir / "mpskit.json").read_text())
    assert record["attempts"][-1]["lean_logits"] == {"asked": True, "training": "lean", "fallbacks": []}
    assert "lean_logits" not in yaml.safe_load((lean_dir / "llamafactory.yaml").read_text())
    plains = [mpskit_run("plain", "lean_logits=false")] if stage != "sft" else []
    if stage != "foodpo":
        out = tmp_path / "cli"
        done = run_llamafactory_cli("train", str(lean_dir / "llamafactory.yaml"), f"output_dir={out}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        plains.append(out)
    lean_rows = logged(lean_dir)
    assert len(lean_rows) == 6 and all(math.isfinite(row["loss"]) for row in lean_rows)
    for plain_dir in plains:
        plain_rows = logged(plain_dir)
        assert [row["current_steps"] for row in plain_rows] == [row["current_steps"] for row in lean_rows]
        for lean_row, plain_row in zip(lean_rows, plain_rows, strict=True):
            shared = [key for key in plain_row if isinstance(plain_row[key], float) and key not in TIMING_KEYS]
            assert "loss" in shared and (stage == "sft" or plain_dir.name == "cli" or "rewards/margins" in shared)
            for key in shared:
                # after a few optimizer steps float32 sums in another order move small rewards (about
                # 0.01) by ~2e-7: the metrics near zero are held to 1e-6, the loss to 1e-5 relative
                tolerance = {"rel": 1e-5} if key == "loss" else {"rel": 1e-5, "abs": 1e-6}
                assert lean_row[key] == pytest.approx(plain_row[key], **tolerance), (key, lean_row["current_steps"])


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_a_16_bit_checkpoint_under_bf16_takes_the_lean_path(tmp_path, tiny_model, stage):
    """Real checkpoints are bf16, and under bf16 mixed precision accelerate hands the hidden states back
    in float32 while the output layer stays bf16: the lean path takes them at the weights' dtype, as
    autocast gives the output layer, and logs the whole-logits run's first loss."""
    from conftest import run_mpskit
    from test_e2e import FAST
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tmp_path / "bf16-model"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(model)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(model)
    words = [f"preset={stage}", f"model_name_or_path={model}", *FAST, "max_steps=2", "logging_steps=1", "bf16=true",
             "eval_strategy=no", "save_steps=1000"]  # fmt: skip
    first = {}
    for name, lean in (("lean", "lean_logits=true"), ("plain", "lean_logits=false")):
        result = run_mpskit("train", *words, lean, f"run_name={name}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        run_dir = (tmp_path / "output" / name / "latest").resolve()
        record = json.loads((run_dir / "mpskit.json").read_text())
        assert record["llamafactory_args"]["bf16"] is True
        rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
        first[name] = next(row["loss"] for row in rows if "loss" in row)
        if name == "lean":
            assert record["attempts"][-1]["lean_logits"]["training"] == "lean"
    assert first["lean"] == pytest.approx(first["plain"], rel=1e-5)


def dequantized_layers(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Plain embedding and output layers holding what a packed model's packs hold (quantize_embeddings), the
    embedding with the hook that makes its output require grad under checkpointing, as LLaMA-Factory sets."""
    inner = model.get_base_model()
    packs = inner.get_input_embeddings().pack, inner.get_output_embeddings().pack
    embedding = torch.nn.Embedding.from_pretrained(packs[0].rows(0, packs[0].shape[0]), freeze=True)
    embedding.register_forward_hook(lambda module, args, output: output.requires_grad_(True))
    output = torch.nn.Linear(packs[1].shape[1], packs[1].shape[0], bias=False)
    output.weight = torch.nn.Parameter(packs[1].rows(0, packs[1].shape[0]), requires_grad=False)
    return embedding, output


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_a_packed_vocabulary_equals_llamafactory_on_the_layers_dequantized(qwen_vocab_model, tmp_path, stage):
    """Lean logits on the 4-bit packed output layer, chunk by chunk of the vocabulary (and the packed
    embedding's lookups), against LLaMA-Factory's own loss on plain layers holding the same weights."""
    from mpskit.engine.bends import packed_vocabulary
    from mpskit.engine.quantized_vocab import PackedOutput
    from mpskit.engine.trainer_builders import build_dpo_trainer
    from mpskit.settings.run_spec import RunSpec

    args = {**trainer_args(qwen_vocab_model, tmp_path, stage), "quantization_bit": 4}
    with packed_vocabulary(RunSpec.of({**args, "quantize_embeddings": True})):
        if stage == "sft":
            plain, lean = build_sft_trainer(args, lean=False), build_sft_trainer(args, lean=True)
        else:
            plain, lean = build_dpo_trainer(args, None, lean=False), build_dpo_trainer(args, None, lean=True)
    randomise_lora(plain.model)
    lean.model = model = plain.model
    inner = model.get_base_model()
    packed = inner.get_input_embeddings(), inner.get_output_embeddings()
    assert isinstance(packed[1], PackedOutput) and packed[1].pack.chunk_rows() < QWEN_VOCAB  # several chunks
    dequantized = dequantized_layers(model)

    def step(trainer, model, batch):
        layers = dequantized if trainer is plain else packed
        inner.set_input_embeddings(layers[0])
        inner.set_output_embeddings(layers[1])
        if stage == "dpo":
            return trainer.get_batch_loss_metrics(model, batch)
        return trainer.compute_loss(model, batch, num_items_in_batch=(batch["labels"] != IGNORE).sum()), {}

    batch = next(iter(plain.get_train_dataloader()))
    assert_same(loss_metrics_grads(plain, step, batch), loss_metrics_grads(lean, step, batch))
    assert lean.lean.report["training"] == "lean"
