"""The real tier: SmolLM2-135M-Instruct (`mpskit get-model smollm2-135m`, which `make install` runs),
trained through `mpskit train` at the demo's settings (mpskit/tools/demo.py) and judged as a user judges
it: what it answers to a question training never asked, before and after, through `mpskit chat` and
through plain transformers on its export; the held-out figures of preference training against the
base model's; and the losses of plain `llamafactory-cli train` on the YAML mpskit wrote.

Marked `real`; those marked `slow` as well run in `make test-real` only: `make test` keeps within its
time with the SFT loss test alone."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DURATION, run_llamafactory_cli, run_mpskit

from mpskit.presets import model_folder
from mpskit.tools.demo import CHAT_PROMPT, MODEL_PRESET, stage_words

pytestmark = [pytest.mark.e2e, pytest.mark.real]
NEW_NAME = "Kestrel"  # what data/identity.json teaches (make_real_data.py)


@pytest.fixture(scope="session")
def real_model() -> Path:
    folder = model_folder(MODEL_PRESET)
    assert (folder / "config.json").is_file(), f"the real model is not in {folder}: mpskit get-model {MODEL_PRESET}"
    return folder


def train(tmp_path: Path, stage: str, *extra: str) -> Path:
    result = run_mpskit("train", *stage_words(stage), *extra, "run_name=real", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    noise = [line for line in result.stderr.splitlines() if line and not line.startswith("mpskit")]
    assert not noise, noise  # the libraries' warnings that ask nothing of the user stay in train.log
    return (tmp_path / "output" / "real" / "latest").resolve()


def log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]


def answer(run_dir: Path, *flags: str) -> str:
    chat = run_mpskit("chat", str(run_dir), "--prompt", CHAT_PROMPT, "--max-new-tokens", "40", *flags)
    assert chat.returncode == 0 and not chat.stderr.strip(), chat.stderr[-2000:]
    return chat.stdout


def generate(model_dir: Path, prompt: str) -> str:
    """Plain transformers, as a user of the exported folder would: its chat template, greedy decoding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)  # fmt: skip
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("bits", [16, 4])
def test_identity_sft_makes_the_model_and_its_export_answer_with_the_new_name(tmp_path, real_model, bits):
    run_dir = train(tmp_path, "sft", *(["quantization_bit=4"] if bits == 4 else []))
    evaluations = [row["eval_loss"] for row in log(run_dir) if "eval_loss" in row]
    assert len(evaluations) >= 2 and evaluations[-1] < evaluations[0] / 3  # held out: before the first step, after
    assert NEW_NAME in answer(run_dir) and NEW_NAME not in answer(run_dir, "--base")
    out = tmp_path / "merged"
    exported = run_mpskit("export", str(run_dir), "-o", str(out), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert NEW_NAME in generate(out, CHAT_PROMPT)
    assert NEW_NAME not in generate(real_model, CHAT_PROMPT)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["dpo", "foodpo"])
def test_preference_training_beats_the_base_model_on_held_out_pairs(tmp_path, real_model, stage):
    run_dir = train(tmp_path, stage)
    rows = [row for row in log(run_dir) if "eval_rewards/accuracies" in row]
    base, trained = rows[0], rows[-1]  # eval_on_start: the adapter changes nothing yet
    assert base["current_steps"] == 0 and base["eval_rewards/log_ratio_gap"] == 0
    assert trained["eval_rewards/accuracies"] > 0.8 and trained["eval_rewards/log_ratio_gap"] > 1


@pytest.mark.parametrize("stage", ["sft", pytest.param("dpo", marks=pytest.mark.slow)])
def test_the_losses_are_those_of_plain_llamafactory_on_the_written_yaml(tmp_path, real_model, stage):
    short = ["max_steps=3", "logging_steps=1", "eval_on_start=false", "eval_strategy=steps", "eval_steps=2"]
    run_dir = train(tmp_path, stage, *short)
    plain = run_llamafactory_cli("train", str(run_dir / "llamafactory.yaml"), f"output_dir={tmp_path / 'cli'}",
                                 cwd=tmp_path)  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    ours, theirs = ([row["loss"] for row in log(folder) if "loss" in row] for folder in (run_dir, tmp_path / "cli"))
    assert len(ours) == len(theirs) == 3
    assert ours[0] == pytest.approx(theirs[0], rel=1e-5)
    # later steps: the bf16 checkpoint computes in bf16, where lean and whole logits' gradients differ in
    # their last bits, and the demo's learning rate (1e-3) carries that into the next losses (0.1-0.9%)
    assert ours[1:] == pytest.approx(theirs[1:], rel=2e-2)
    held_out = [row for row in log(run_dir) if "eval_loss" in row]
    assert held_out and held_out[0]["current_steps"] == 2  # evaluation on, as the presets run it


@pytest.mark.slow
def test_the_demo_teaches_the_real_model_and_says_what_changed(tmp_path, real_model):
    result = subprocess.run([sys.executable, "-m", "mpskit.cli", "demo"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    sections = re.split(r"^mpskit demo: \d/3 training ", out, flags=re.M)[1:]
    assert [section.split()[0] for section in sections] == ["sft", "dpo", "foodpo"]
    for stage, section, steps in zip(("sft", "dpo", "foodpo"), sections, (40, 10, 10), strict=True):
        assert len(re.findall(rf"^  mpskit: step \d+/{steps} \| loss", section, re.M)) == steps // 5  # every 5 steps
        assert re.search(rf"^  mpskit: {stage} run finished in {DURATION}: step {steps}/{steps}", section, re.M)
    rows = {line.split()[0]: line for line in out.splitlines()
            if line.split()[:1] in (["sft"], ["dpo"], ["foodpo"]) and " -> " in line}  # fmt: skip
    before, after = map(float, re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", rows["sft"]).groups())
    assert after < before / 3  # SFT: the held-out answers of the new identity far likelier than before
    for stage in ("dpo", "foodpo"):
        gap = re.search(r"gap (-?\d+\.\d+) -> (\d+\.\d+), accuracy (\d\.\d+) -> (\d\.\d+)", rows[stage])
        gap_before, gap_after, accuracy_before, accuracy_after = map(float, gap.groups())
        assert gap_before == 0 and gap_after > 0.5 and accuracy_before == 0 and accuracy_after > 0.7
    table = out[out.index("stage   loss") :].split("\n\n")[0].splitlines()
    assert len(table) == 5 and max(len(line) for line in table) <= 80, table
    before_sft, after_sft = re.findall(r"^mpskit demo: (?:before|after) SFT.*\n(.*)$", out, re.M)
    assert NEW_NAME not in before_sft and NEW_NAME in after_sft  # the held-out question, through mpskit chat
    sft_run = (tmp_path / "output" / "demo-sft" / "latest").resolve()
    assert NEW_NAME in answer(sft_run)
    [in_llama_cpp] = re.findall(r"^mpskit demo: the SFT run as a q8_0 GGUF file, in llama.cpp: .*\n(.*)$", out, re.M)
    assert NEW_NAME in in_llama_cpp and len(list((tmp_path / "output" / "demo-gguf").glob("*/*.q8_0.gguf"))) == 1


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["Ctrl-C to its process group", "SIGTERM to the demo"])
def test_a_demo_stopped_at_a_step_saves_records_and_its_resume_line_finishes_the_stage(tmp_path, real_model, stop):
    """The demo passes the signal on to its training child, reads on until the child has saved and
    recorded its stop, and ends with the child's resume line (it used to exit at once, and the child
    died of a broken pipe with no checkpoint)."""
    import os
    import signal

    mine = tmp_path / "output" / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("the user's own")
    demo = subprocess.Popen([sys.executable, "-m", "mpskit.cli", "demo"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    lines = []
    while "mpskit: step 35/40" not in (line := demo.stdout.readline()):
        assert line, "".join(lines)[-3000:]
        lines.append(line)
    if stop.startswith("Ctrl-C"):
        os.killpg(demo.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    else:
        demo.send_signal(signal.SIGTERM)
    out = "".join(lines) + demo.stdout.read()
    assert demo.wait(timeout=300) == 130, out[-3000:]
    assert "Traceback" not in out and "BrokenPipeError" not in out, out[-3000:]
    [resume] = re.findall(r"resume with: (mpskit train --resume \S+)$", out, re.M)
    run_dir = tmp_path / resume.split()[-1]
    attempt = json.loads((run_dir / "mpskit.json").read_text())["attempts"][-1]
    assert attempt["outcome"] == f"stopped by {'SIGINT' if stop.startswith('Ctrl-C') else 'SIGTERM'}"
    assert [path.name for path in run_dir.glob("checkpoint-*")] in (["checkpoint-35"], ["checkpoint-36"])
    assert not (run_dir / ".mpskit.lock").exists()  # the child has ended: the demo waited for it
    resumed = run_mpskit(*resume.split()[1:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == 40
    assert mine.read_text() == "the user's own"
