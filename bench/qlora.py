"""4-bit bases against 16-bit ones, on the CPU: the stand-in for MPS (bitsandbytes runs the same NF4).

The model is a random Qwen2-architecture one with 268M decoder-linear parameters (hidden 1024, 16
layers, FFN 4096, the tiny model's tokenizer; `--shape 85m`: hidden 768, 12 layers, FFN 2048), saved in
bf16 shards of 100 MB. Each case is SFT at cutoff 256, batch 2 (`--batch`), LoRA rank 8 on every linear
layer, checkpointing on, bf16, 3 optimizer steps, in a fresh `mpskit train` process; each round runs
the 16-bit and the 4-bit case in turn (A B, then B A in the next round). From mpskit.json (RSS above
the imports, the memory monitor's figures):
  - training memory: the run's peak, loading included;
  - the loading peak: the highest it went before the first step, against the base's size on disk;
  - the step time: the median of the steps after the first.
  - the plan's error: (planned - measured) / measured training memory;
  - the plan (loading or step, the higher, plus the libraries' code a run first runs) against the whole
    run's peak as GNU time reads it: the training process's peak RSS as the kernel keeps it (a
    launcher's one child), minus its RSS after the imports (the record's baseline); target within 15%;
Then each run is exported (`mpskit export`, in a fresh process whose peak RSS is reset after the
imports): the 16-bit run through LLaMA-Factory's export (the whole model loaded, merged, saved), the
4-bit one merged shard by shard from the 16-bit base; the peak above the imports, against the
merged model's size on disk.
Prints the medians and spread over the rounds, the 4-bit / 16-bit ratios, and the share of the bytes
that 4-bit weights can save (the decoder's linear weights, 2 bytes -> 0.516) that the measured
peak saves. Targets: that share at least 70%; the 4-bit loading peak below the base's size; the
shard-by-shard export peak at most 0.6x the merged model.

glibc's heap keeps the pages of freed buffers below its mmap threshold, which on the CPU makes the
training peak vary by tenths of a GB between identical runs (dequantizing 4-bit weights in every
matmul frees many such buffers). `--fixed-mmap-threshold` runs both arms with MALLOC_MMAP_THRESHOLD_
at 1 MiB, so buffers of 1 MiB and more go back to the system when freed: the same comparison with
that noise left out. `--fp32` runs both arms with bf16=false: no autocast, so the bf16 shards compute in
bf16 as stored (LLaMA-Factory loads them so). `--no-checkpointing` turns gradient checkpointing off.

    python bench/qlora.py [--repeats 3] [--fixed-mmap-threshold] [--fp32] [--no-checkpointing] [--batch 2]
                          [--shape 268m|85m] [--out FILE.json]

A run without the options writes bench/results/qlora-SHAPE.json; docs/quantized.md renders it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import results_file  # noqa: E402
from gguf_export import peak_of  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.errors import MpskitError  # noqa: E402
from mpskit.plan.duration import steady_step_s  # noqa: E402
from mpskit.plan.memory import QUANTIZED_BYTES  # noqa: E402
from mpskit.rundir.folder import RunDir  # noqa: E402
from mpskit.self_command import mpskit_command  # noqa: E402
from mpskit.trials.measure import OFFLINE, fresh_process_env, write_long_data  # noqa: E402

SHAPES = {
    "268m": dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                 intermediate_size=4096),
    "85m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                intermediate_size=2048),
}  # fmt: skip
GIB = 1024**3
SHARE_TARGET = 0.70
WHOLE_RUN_TARGET = 0.15  # the plan (loading or step, the higher) against the whole process's peak
EXPORT_TARGET = 0.6
# `mpskit export` with the libraries imported first, the kernel's peak RSS (VmHWM) reset after them.
EXPORT = """
import json, re, sys
from pathlib import Path
import llamafactory.train.tuner, llamafactory.data, llamafactory.model
from mpskit.engine.quantized import import_bitsandbytes
from mpskit.tools import merge_shards, use_run
import_bitsandbytes()
def rss(field):
    return int(re.search(field + r":\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024
Path("/proc/self/clear_refs").write_text("5")
baseline = rss("VmRSS")
use_run.export(sys.argv[1], sys.argv[2])
print(json.dumps({"export_peak_gb": (rss("VmHWM") - baseline) / 1024**3}))
"""
ARMS = {"16-bit": [], "4-bit": ["quantization_bit=4"]}


def bf16_shards(out: Path, dims: dict):
    """A random model of DIMS with the tiny model's tokenizer, saved in bf16 shards of 100 MB under
    OUT/bf16 (also bench/packed_vocab.py's); the model as saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mpskit.tools.tiny import build_tiny_model

    float32 = build_tiny_model(out / "float32", ROOT / "data", dims=dims)
    model = AutoModelForCausalLM.from_pretrained(float32, dtype=torch.bfloat16)
    model.save_pretrained(out / "bf16", max_shard_size="100MB")
    AutoTokenizer.from_pretrained(float32).save_pretrained(out / "bf16")
    return model


def build_model(out: Path, shape: str) -> tuple[Path, int]:
    """The bench's model in bf16 shards, and its count of decoder-linear weights."""
    model = bf16_shards(out, SHAPES[shape])
    linear = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name and p.dim() == 2)
    return out / "bf16", linear


def run_case(model: Path, data: Path, out: Path, extra: list[str], env: dict[str, str], batch: int) -> dict:
    words = [
        "stage=sft", f"model_name_or_path={model}", "template=qwen", f"dataset_dir={data}", "dataset=long_sft",
        "eval_dataset=", "eval_strategy=no", "cutoff_len=256", f"per_device_train_batch_size={batch}",
        "gradient_accumulation_steps=1", "lora_rank=8", "lora_target=all", "disable_gradient_checkpointing=false",
        "bf16=true", "max_steps=3", "logging_steps=1", "save_strategy=no", "plot_loss=false",
        "memory_budget_gb=1000", f"output_dir={out}", *extra,
    ]  # fmt: skip
    _, outside_peak, _ = peak_of(mpskit_command("train", *words), env)  # GNU time's figure, nothing reset
    memory = RunDir.open(out).record.memory
    measured = memory.measured
    whole_run_gb = outside_peak * 1e9 / GIB - measured.baseline_gb  # above the RSS after the imports
    planned = memory.predicted
    planned_gb = max(planned.get("loading_gb") or 0, memory.predicted_training_gb or 0) + planned["libraries_gb"]
    merged = out.parent / f"{out.name}-merged"
    exported = subprocess.run([sys.executable, "-c", EXPORT, str(out), str(merged)], capture_output=True, text=True,
                              env=fresh_process_env({**OFFLINE, **env}))  # fmt: skip
    if exported.returncode != 0:
        raise MpskitError(f"export of {out} failed: {exported.stderr.strip()[-300:]}", f"run mpskit export {out}")
    merged_gb = sum(path.stat().st_size for path in merged.glob("*.safetensors")) / GIB
    return {
        "training_gb": measured.training_gb,
        "training_plan_error": memory.error,  # (plan - measured) / measured
        "whole_run_gb": whole_run_gb,  # the whole process's peak as outside tools read it, above the imports
        "whole_run_plan_error": planned_gb / whole_run_gb - 1,
        "libraries_gb": measured.libraries_gb,  # the libraries' pages the run first used, at its peak
        "loading_peak_gb": measured.loading_peak_gb,
        "loading_estimate_gb": memory.predicted.get("loading_gb"),
        "step_s": steady_step_s(measured.step_seconds),
        "export_peak_x": json.loads(exported.stdout.strip().splitlines()[-1])["export_peak_gb"] / merged_gb,
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


ARM_FIGURES = {"training_gb": "training memory, GB above the imports, loading included",
               "loading_peak_gb": "loading peak, GB", "step_s": "step time, s",
               "export_peak_x": "export peak / merged model (16-bit: LLaMA-Factory's export; 4-bit: shard by shard)"}
ARM_COLUMNS = [Column("", "figure"), Column("16-bit", "16-bit", ".3f"), Column("4-bit", "4-bit", ".3f"),
               Column("4-bit / 16-bit", "ratio")]  # fmt: skip


def arms_table(shape: str = "268m", at: Path | None = None) -> str:
    """docs/quantized.md's table of the 16-bit and 4-bit arms: medians and [range] over the rounds, and what
    4 bits saved of what 4-bit weights can save."""
    results = results_file.load(f"qlora-{shape}", at)
    rounds = results["rounds"]
    rows = results_file.arm_rows(rounds, ARM_FIGURES, "4-bit", "16-bit")
    savable = results["linear"] * (2 - QUANTIZED_BYTES[4]) / GIB
    saved = statistics.median(r["16-bit"]["training_gb"] - r["4-bit"]["training_gb"] for r in rounds)
    loading = statistics.median(r["4-bit"]["loading_peak_gb"] for r in rounds) / results["base_gb"]
    return results_file.block(ARM_COLUMNS, results, f"4 bits saved {saved:.3f} GB of the {savable:.3f} GB that "
                              f"4-bit weights can save: {saved / savable:.0%} (target {SHARE_TARGET:.0%}). The 4-bit "
                              f"loading peak is {loading:.2f}x the base's {results['base_gb']:.3f} GB on disk.",
                              rows=rows)  # fmt: skip


PLAN_COLUMNS = [Column("run", "run"), Column("16-bit plan error", "16-bit", "+.1%"),
                Column("16-bit measured GB", "16-bit_gb", ".3f"), Column("4-bit plan error", "4-bit", "+.1%"),
                Column("4-bit measured GB", "4-bit_gb", ".3f")]  # fmt: skip


def plan_row(results: dict, run: str) -> dict:
    """The plan's error on training memory per arm, medians and [range] over the rounds."""
    rounds = results["rounds"]
    row = {"run": run}
    for arm in ARMS:
        row[arm] = results_file.spread([r[arm]["training_plan_error"] for r in rounds])
        row[f"{arm}_gb"] = statistics.median(r[arm]["training_gb"] for r in rounds)
    return row


def plan_table(at: Path | None = None) -> str:
    """docs/quantized.md's table of the plan on this bench's model: the default run (qlora-268m.json), then the
    runs with options (qlora-options.json, each with its command)."""
    options = results_file.load("qlora-options", at)
    rows = [plan_row(results_file.load("qlora-268m"), "`python bench/qlora.py --repeats 3`, bf16 (autocast)"),
            *options["rows"]]  # fmt: skip
    return results_file.block(PLAN_COLUMNS, options, rows=rows)


def whole_run_table() -> str:
    """docs/quantized.md's table (through scripts/docs_tables.py) from the results of each shape:
    medians over the rounds, GB above the imports, and the plan's error against GNU time's figure."""
    rows = ["| shape, arm | run's own peak | libraries' pages | GNU time's peak | plan's error |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for shape in SHAPES:
        results = json.loads((ROOT / "bench" / "results" / f"qlora-{shape}.json").read_text())
        for arm in ARMS:
            cases = [r[arm] for r in results["rounds"]]
            median = {key: statistics.median(c[key] for c in cases) for key in
                      ("training_gb", "libraries_gb", "whole_run_gb", "whole_run_plan_error")}  # fmt: skip
            rows.append(f"| {shape}, {arm} | {median['training_gb']:.3f} | {median['libraries_gb']:.3f} | "
                        f"{median['whole_run_gb']:.3f} | {median['whole_run_plan_error']:+.1%} |")  # fmt: skip
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both cases (default 3)")
    parser.add_argument("--fixed-mmap-threshold", action="store_true", help="glibc's mmap threshold fixed at 1 MiB")
    parser.add_argument("--fp32", action="store_true", help="bf16=false: the shards compute as stored, no autocast")
    parser.add_argument("--no-checkpointing", action="store_true", help="gradient checkpointing off")
    parser.add_argument("--batch", type=int, default=2, help="per_device_train_batch_size (default 2)")
    parser.add_argument("--shape", choices=list(SHAPES), default="268m", help="the model's shape (default 268m)")
    parser.add_argument("--out", help="the results file (default: bench/results/qlora-SHAPE.json without the "
                        "options that change the run)")
    ns = parser.parse_args()
    if ns.repeats < 1:
        raise SystemExit("mpskit: error: --repeats must be at least 1; give --repeats 3")
    with tempfile.TemporaryDirectory(prefix="mpskit-bench-qlora-") as tmp:
        work = Path(tmp)
        model, linear = build_model(work / "model", ns.shape)
        base_gb = sum(path.stat().st_size for path in model.glob("*.safetensors")) / GIB
        data = write_long_data(work / "data")
        rounds = []
        env = {"MALLOC_MMAP_THRESHOLD_": str(1024**2)} if ns.fixed_mmap_threshold else {}
        for i in range(ns.repeats):
            order = list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]
            options = [*(["bf16=false"] if ns.fp32 else []),
                       *(["disable_gradient_checkpointing=true"] if ns.no_checkpointing else [])]  # fmt: skip
            extra = {arm: [*ARMS[arm], *options] for arm in order}
            figures = {arm: run_case(model, data, work / f"run-{i}-{arm}", extra[arm], env, ns.batch) for arm in order}
            rounds.append(figures)
            print(f"round {i + 1}: " + "; ".join(f"{arm} {json.dumps(figures[arm])}" for arm in ARMS), flush=True)
    savable_gb = linear * (2 - QUANTIZED_BYTES[4]) / GIB
    saved = [r["16-bit"]["training_gb"] - r["4-bit"]["training_gb"] for r in rounds]
    print(f"\nmodel: {linear / 1e6:.0f}M decoder-linear weights, base {base_gb:.3f} GB on disk (bf16); 4 bits can "
          f"save {savable_gb:.3f} GB of them")  # fmt: skip
    for key, label in (("training_gb", "training memory GB"), ("loading_peak_gb", "loading peak GB"),
                       ("step_s", "step time s"), ("export_peak_x", "export peak / model")):  # fmt: skip
        values = {arm: [r[arm][key] for r in rounds] for arm in ARMS}
        ratios = [r["4-bit"][key] / r["16-bit"][key] for r in rounds]
        print(f"{label:20} 16-bit {spread(values['16-bit'])}  4-bit {spread(values['4-bit'])}  "
              f"4-bit/16-bit {spread(ratios)}")  # fmt: skip
    errors = {arm: [r[arm]["training_plan_error"] for r in rounds] for arm in ARMS}
    print("training memory, plan against measured: " + ", ".join(f"{arm} {spread(errors[arm])}" for arm in ARMS))
    whole = {arm: [r[arm]["whole_run_plan_error"] for r in rounds] for arm in ARMS}
    print("plan against the whole run's peak as GNU time reads it (above the imports): "
          + ", ".join(f"{arm} {spread(whole[arm])}" for arm in ARMS) + f" (target within {WHOLE_RUN_TARGET:.0%})")
    within = all(abs(statistics.median(values)) <= WHOLE_RUN_TARGET for values in whole.values())
    share = statistics.median(saved) / savable_gb
    loading = [r["4-bit"]["loading_peak_gb"] / base_gb for r in rounds]
    loading_error = [r["4-bit"]["loading_estimate_gb"] / r["4-bit"]["loading_peak_gb"] - 1 for r in rounds]
    print(f"saved by 4 bits: {spread(saved)} GB = {share:.0%} of what 4-bit weights can save (target >= "
          f"{SHARE_TARGET:.0%}); 4-bit loading peak / base size {spread(loading)} (target < 1), "
          f"predicted {rounds[0]['4-bit']['loading_estimate_gb']:.3f} GB: error {spread(loading_error)}")  # fmt: skip
    export = statistics.median(r["4-bit"]["export_peak_x"] for r in rounds)
    print(f"shard-by-shard export peak {export:.2f}x the merged model (target <= {EXPORT_TARGET}x)")
    options = ns.fixed_mmap_threshold or ns.fp32 or ns.no_checkpointing or ns.batch != 2
    out = ns.out or (None if options else results_file.path(f"qlora-{ns.shape}"))
    if out:
        results_file.save([], Path(out), rounds=rounds, linear=linear, base_gb=base_gb)
    return 0 if share >= SHARE_TARGET and statistics.median(loading) < 1 and export <= EXPORT_TARGET and within else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MpskitError as err:
        print(f"mpskit: error: {err}", file=sys.stderr)
        sys.exit(2)
