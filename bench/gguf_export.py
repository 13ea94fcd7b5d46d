"""`mpskit export --gguf`: its time and memory against the Hugging Face export's, and llama.cpp's speed of
answering against `mpskit chat`'s, on this machine.

Two runs: the demo's identity SFT of the real model (SmolLM2-135M-Instruct, trained here: 40 steps), and
one LoRA step on a random Qwen2-shaped model of 0.6B parameters (1.2 GB of bf16 weights; the tiny
model's tokenizer).

Exports: each run through `mpskit export --gguf f16`, `--gguf q8_0` and the Hugging Face export, each in
a fresh process, the three interleaved round by round (A B C, A B C, ...). The wall time, and the
process's peak RSS as the kernel keeps it for the process (getrusage of a launcher's one child: nothing
is reset, no other tool's figure moves; see LAUNCHER), against the merged model's size in bf16 (its
base's). "Above the imports": that peak minus the peak of a process that only imports what the export
imports. Target: the GGUF export's peak above the imports at most 0.6x the merged model.

Answers: the real run answering ANSWER_PROMPT (at most 64 new tokens, greedy, to the end of the turn),
each engine in a fresh process, interleaved: llama.cpp on the q8_0 and f16 files (xllamacpp) and
LLaMA-Factory's engine as `mpskit chat RUN` runs it (the adapter on the bf16 base). Each answers once to
warm up, then the answer is timed: its tokens over its seconds, the prompt's processing included, as
a user waits for it. Medians and spread, and the ratios to `mpskit chat`'s.

The demo's ending (`make demo` after its three stages): the two `mpskit chat` answers of the real run
alone, as the demo ended before, against its ending now (the two answers and the q8_0 export at once,
then llama.cpp's answer), interleaved; the seconds each takes.

    python bench/gguf_export.py [--repeats 3] [--out bench/results/gguf.json]
    python scripts/docs_tables.py     (docs/gguf.md's table from those results)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mpskit.errors import MpskitError  # noqa: E402
from mpskit.presets import demo_data_dir, model_folder  # noqa: E402
from mpskit.rundir.folder import RunDir  # noqa: E402
from mpskit.tools.demo import MODEL_PRESET, stage_words  # noqa: E402
from mpskit.trials.measure import OFFLINE, fresh_process_env, train_in_fresh_process  # noqa: E402

GB = 1e9
TARGET = 0.6
NEW_TOKENS = 64
ANSWER_PROMPT = "Write a short poem about the sea."  # a longer answer than the identity question gets
RANDOM_SHAPE = {"hidden_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 2,
                "intermediate_size": 5632, "vocab_size": 32000, "tie_word_embeddings": True}  # fmt: skip
EXPORTS = {"gguf f16": ["--gguf", "f16"], "gguf q8_0": ["--gguf", "q8_0"], "hf": []}
IMPORTS = "import llamafactory.data, llamafactory.hparams, llamafactory.model, mpskit.tools.gguf_export"
LLAMA_CPP = """
import json, sys, time
from pathlib import Path
from mpskit.tools.llama_cpp import llama_server
with llama_server(Path(sys.argv[1])) as server:
    request = {"messages": [{"role": "user", "content": sys.argv[2]}], "temperature": 0, "cache_prompt": False}
    server.handle_chat_completions({**request, "max_tokens": 8})  # warm
    started = time.perf_counter()
    result = server.handle_chat_completions({**request, "max_tokens": int(sys.argv[3])})
    seconds = time.perf_counter() - started
tokens = result["usage"]["completion_tokens"]
print(json.dumps({"tokens": tokens, "per_s": tokens / seconds}))
"""
LLAMA_FACTORY = """
import json, sys, time
from mpskit.rundir.folder import RunDir
from mpskit.run.quiet import library_output
from mpskit.tools.use_run import inference_args
args = inference_args(RunDir.open(sys.argv[1]))
with library_output():
    from llamafactory.chat import ChatModel
    model = ChatModel({**args, "do_sample": False, "max_new_tokens": int(sys.argv[3])})
messages = [{"role": "user", "content": sys.argv[2]}]
model.chat(messages, max_new_tokens=8)  # warm
started = time.perf_counter()
[answer] = model.chat(messages)
seconds = time.perf_counter() - started
print(json.dumps({"tokens": answer.response_length, "per_s": answer.response_length / seconds}))
"""


# Each measured process starts from this small one: a process forked from a large one starts with that
# one's high-water mark (the kernel keeps it across exec), and this bench holds torch and a 1.2 GB model.
LAUNCHER = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)")


def peak_of(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """A fresh process's wall seconds, its peak RSS in GB (the kernel's figure for that one process, through
    a launcher that has no other child), and its stdout."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", LAUNCHER, *command], capture_output=True, text=True,
                          env=fresh_process_env({**OFFLINE, **(env or {})}))  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode:
        raise MpskitError(f"{' '.join(command[2:5])} failed: {done.stderr.strip()[-300:]}", "run it alone")
    return wall, int(done.stderr.strip().splitlines()[-1]) * 1024 / GB, done.stdout


def train_runs(work: Path) -> dict[str, Path]:
    """The real model's identity run, and one LoRA step on the random 0.6B model."""
    real = work / "real"
    train_in_fresh_process([*stage_words("sft"), f"output_dir={real}"], "the identity run", f"see {real}")
    model = work / "random-model"
    subprocess.run([sys.executable, __file__, "--random-model", str(model)], check=True, env=fresh_process_env(OFFLINE))
    random_run = work / "random"
    words = ["stage=sft", f"model_name_or_path={model}", "template=qwen", f"dataset_dir={demo_data_dir()}",
             "dataset=identity", "eval_strategy=no", "cutoff_len=32", "per_device_train_batch_size=1",
             "gradient_accumulation_steps=1", "max_steps=1", "save_strategy=no", "plot_loss=false",
             "memory_budget_gb=1000", f"output_dir={random_run}"]  # fmt: skip
    train_in_fresh_process(words, "the random model's run", f"see {random_run}")
    return {"real 135M": real, "random 0.6B": random_run}


def bf16_size(run: Path) -> float:
    """The merged model's size in the base's own bf16 (GB): its base's safetensors."""
    from mpskit.tools.use_run import local_base

    base = local_base(str(RunDir.open(run).yaml_args()["model_name_or_path"]))
    return sum(path.stat().st_size for path in base.glob("*.safetensors")) / GB


def random_model(out: Path) -> Path:
    """RANDOM_SHAPE in bf16 with the tiny model's tokenizer (its ids are the first rows)."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from mpskit.tools.tiny import build_tiny_model

    tiny = build_tiny_model(out.parent / "tiny", ROOT / "data")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = Qwen2Config(**RANDOM_SHAPE, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def demo_endings(run: Path, work: Path, repeats: int) -> dict[str, list[float]]:
    """The demo's ending before and with the GGUF step, timed round by round (mpskit/tools/demo.py's own
    functions; the step's parallel layout is the demo's)."""
    from concurrent.futures import ThreadPoolExecutor

    from mpskit.tools.demo import CHAT_PROMPT, ask, gguf_file_of

    seconds: dict[str, list[float]] = {"two chats": [], "two chats and the GGUF step": []}
    for round_ in range(repeats):
        started = time.perf_counter()
        for base in (True, False):
            ask(run, CHAT_PROMPT, work / f"chat-{round_}-{base}.log", base)
        seconds["two chats"].append(time.perf_counter() - started)
        started = time.perf_counter()
        with ThreadPoolExecutor() as pool:
            chats = [pool.submit(ask, run, CHAT_PROMPT, work / f"both-{round_}-{base}.log", base) for base in (1, 0)]
            exported = pool.submit(gguf_file_of, run, work / f"demo-gguf-{round_}", work / f"export-{round_}.log")
            [chat.result() for chat in chats]
            ask(exported.result(), CHAT_PROMPT, work / f"gguf-{round_}.log", temperature=0)
        seconds["two chats and the GGUF step"].append(time.perf_counter() - started)
    return seconds


def spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--out", default=str(RESULTS), help="the figures as JSON (default bench/results/gguf.json)")
    parser.add_argument("--random-model", help=argparse.SUPPRESS)  # the bench's child that builds it
    ns = parser.parse_args()
    if ns.random_model:
        random_model(Path(ns.random_model))
        return 0
    if not (model_folder(MODEL_PRESET) / "config.json").is_file():
        raise MpskitError("the bench exports the real model's run", f"mpskit get-model {MODEL_PRESET}")
    mpskit = [sys.executable, "-m", "mpskit.cli"]
    results: dict = {"exports": {}, "answers": {}, "new_tokens": NEW_TOKENS}
    with tempfile.TemporaryDirectory(prefix="mpskit-bench-gguf-") as tmp:
        work = Path(tmp)
        runs = train_runs(work)
        _, imports_gb, _ = peak_of([sys.executable, "-c", IMPORTS])
        results["imports_gb"] = imports_gb
        for name, run in runs.items():
            figures: dict[str, dict[str, list[float]]] = {kind: {"seconds": [], "peak_gb": []} for kind in EXPORTS}
            for round_ in range(ns.repeats):
                for kind, flags in EXPORTS.items():
                    out = work / f"{name.split()[0]}-{kind.split()[-1]}-{round_}"
                    seconds, peak, _ = peak_of([*mpskit, "export", str(run), *flags, "-o", str(out)])
                    figures[kind]["seconds"].append(seconds)
                    figures[kind]["peak_gb"].append(peak)
            results["exports"][name] = {"merged_gb": bf16_size(run), **figures}
        real = runs["real 135M"]
        files = {f"llama.cpp {kind}": next((work / f"real-{kind}-0").glob("*.gguf")) for kind in ("q8_0", "f16")}
        rates: dict[str, list[float]] = {"llama.cpp q8_0": [], "llama.cpp f16": [], "mpskit chat (LLaMA-Factory)": []}
        for _ in range(ns.repeats):
            for engine in rates:
                script, target = (LLAMA_CPP, files[engine]) if engine in files else (LLAMA_FACTORY, real)
                _, _, out = peak_of([sys.executable, "-c", script, str(target), ANSWER_PROMPT, str(NEW_TOKENS)])
                rates[engine].append(json.loads(out.strip().splitlines()[-1])["per_s"])
        results["answers"] = rates
        results["demo_ending_s"] = demo_endings(real, work, ns.repeats)
    report(results)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(results, indent=2) + "\n")
    above = [statistics.median(f["gguf " + t]["peak_gb"]) - results["imports_gb"]
             for f in results["exports"].values() for t in ("f16", "q8_0")]  # fmt: skip
    merged = [f["merged_gb"] for f in results["exports"].values() for _ in (0, 1)]
    return 0 if max(a / m for a, m in zip(above, merged, strict=True)) <= TARGET else 1


RESULTS = ROOT / "bench" / "results" / "gguf.json"


def table(results: dict | None = None) -> str:
    """The figures as docs/gguf.md shows them (scripts/docs_tables.py writes it there), from RESULTS."""
    results = results or json.loads(RESULTS.read_text(encoding="utf-8"))
    lines = ["| run (merged bf16 size) | export | seconds | peak RSS GB | above the imports / model |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, figures in results["exports"].items():
        merged = figures["merged_gb"]
        for kind in EXPORTS:
            peaks = figures[kind]["peak_gb"]
            above = [(peak - results["imports_gb"]) / merged for peak in peaks]
            label = {"hf": "Hugging Face folder"}.get(kind, f"`--gguf {kind.split()[-1]}`")
            lines.append(f"| {name} ({merged:.2f} GB) | {label} | {spread(figures[kind]['seconds'], 1)} | "
                         f"{spread(peaks)} | {spread(above)} |")  # fmt: skip
    rates = results["answers"]
    base = rates["mpskit chat (LLaMA-Factory)"]
    lines += ["", "| answering with | tokens/s | against `mpskit chat` |", "|---|---|---|"]
    for engine, values in rates.items():
        ratios = [value / reference for value, reference in zip(values, base, strict=True)]
        lines.append(f"| {engine} | {spread(values, 1)} | {spread(ratios, 1)}x |")
    endings = results["demo_ending_s"]
    added = [with_step - alone for alone, with_step in zip(endings["two chats"], endings["two chats and the GGUF step"],
                                                            strict=True)]  # fmt: skip
    lines += ["", "| `make demo`'s ending | seconds |", "|---|---|"]
    lines += [f"| {name} | {spread(values, 1)} |" for name, values in endings.items()]
    lines.append(f"| the GGUF step adds | {spread(added, 1)} |")
    return "\n".join(lines)


def summary(results: dict | None = None) -> str:
    """README's line of these figures (scripts/docs_tables.py writes it there)."""
    results = results or json.loads(RESULTS.read_text(encoding="utf-8"))
    name, figures = max(results["exports"].items(), key=lambda item: item[1]["merged_gb"])
    above = statistics.median(figures["gguf f16"]["peak_gb"]) - results["imports_gb"]
    rates = results["answers"]
    faster = statistics.median(llama / chat for llama, chat in zip(rates["llama.cpp q8_0"],
                                                                    rates["mpskit chat (LLaMA-Factory)"], strict=True))
    return (f"Measured here (`python bench/gguf_export.py`, 2-core CPU): the {name} model ({figures['merged_gb']:.2f} "
            f"GB in bf16) exports to f16 in {statistics.median(figures['gguf f16']['seconds']):.0f} s, holding "
            f"{above / figures['merged_gb']:.2f}x its size above the imports; in q8_0, llama.cpp answers "
            f"{faster:.1f}x as fast as `mpskit chat`.")


def report(results: dict) -> None:
    print(f"imports alone: peak {results['imports_gb']:.2f} GB; medians (min-max) over the rounds")
    print(table(results))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MpskitError as err:
        print(f"mpskit: error: {err}", file=sys.stderr)
        sys.exit(2)
