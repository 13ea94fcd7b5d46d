"""Training memory and step time of lean attention against SDPA's math path and the fused SDPA.

MPS runs SDPA on its math path, which keeps every layer's float32 heads x s x s probabilities; on
this CPU SDPA is fused. So the math path is forced here with `sdpa_kernel(SDPBackend.MATH)`: it is
the stand-in for what a Mac runs. For each case `mpskit config` writes one LLaMA-Factory YAML (every
knob pinned, lean logits on) for a random-initialised model with Qwen's vocabulary. Then, each run
a fresh process, the arms in turn, each round in a rotated order (A B C, B C A, C A B, ...):
  math   SDPA forced to its math backend (the MPS stand-in), lean_attention=false;
  lean   lean_attention=true;
  fused  the CPU's own SDPA (fused), lean_attention=false.
Training memory is what the run adds after the imports (mpskit's memory monitor: peak RSS on the
CPU, CUDA's allocator counter on a GPU); step time is the median of the steps after the first.
Ratios are per round, shown as their median and [min-max]. `estimate` is the memory model's figure
for the arm (the math path counted as eager attention, which keeps the same probabilities) and
`error` its error against the median measurement; `loss diff` is the largest relative difference of
a logged loss from the math arm's.

    python bench/lean_attention.py [--repeats 2] [--steps 3] [--case N ...] [--checkpointing on|off] [--device cuda]
    python bench/lean_attention.py --block-mib 2 8 32 --case 0    lean arms with these block budgets
    python bench/lean_attention.py --kernel [--block-mib 2 8 32 128]  the attention call alone

A run of every case writes bench/results/lean-attention.json, and --kernel lean-attention-kernel.json
(or --out FILE.json); docs/lean-paths.md renders them.

An arm the memory model puts above this machine's available memory is skipped, and said.

Targets: at 4096, lean's training memory <= 0.5 x the math arm's and <= 1.15 x the fused arm's; its
step time <= 1.3 x the math arm's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import results_file  # noqa: E402
from lean_logits import HARDWARE, loss_diff, one_run, spread, write_measured, write_yaml  # noqa: E402
from memory_accuracy import MODELS  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.plan.memory import FRAMEWORK_BYTES, GB, Knobs, dims_from_mapping, estimate  # noqa: E402
from mpskit.settings.run_spec import RunSpec  # noqa: E402
from mpskit.trials.measure import write_long_data  # noqa: E402

# (model, stage, cutoff_len), batch 1, each with checkpointing on and off
CASES = [("mid", "sft", 4096), ("mid", "dpo", 2048), ("mid", "dpo", 4096), ("qwen2.5-0.5b", "dpo", 2048)]
ARMS = ("math", "lean", "fused")
MEMORY_VS_MATH, MEMORY_VS_FUSED, TIME_VS_MATH = 0.5, 1.15, 1.3


def arm_knobs(arm: str, cutoff: int, checkpointing: bool) -> Knobs:
    """The memory model's knobs for an arm: SDPA's math path saves what eager attention saves."""
    knobs = Knobs(batch=1, cutoff_len=cutoff, lora_rank=8, checkpointing=checkpointing, lean_logits=True)
    return replace(knobs, attention="eager" if arm == "math" else "sdpa", lean_attention=arm == "lean")


def worker(yaml_file: str, arm: str, device: str, out: str) -> None:
    import yaml

    from mpskit.engine import lf
    from mpskit.engine.bends import hide_accelerators
    from mpskit.plan import memory

    arm, _, block_mib = arm.partition(":")  # lean:32 is lean attention with 32 MiB blocks
    if block_mib:
        memory.LEAN_ATTENTION_BLOCK_BYTES["cpu" if device == "cpu" else "gpu"] = int(block_mib) * 1024**2
    if device == "cpu":
        hide_accelerators()
    args = {**yaml.safe_load(Path(yaml_file).read_text()), "output_dir": out}
    lf.import_engine()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mpskit.run.monitor import MemoryMonitor

    monitor = MemoryMonitor(device)  # after the imports: its baseline
    math_path = sdpa_kernel(SDPBackend.MATH) if arm == "math" else contextlib.nullcontext()
    with math_path:
        _, attention, _ = lf.run(RunSpec.of({**args, "lean_logits": True, "lean_attention": arm == "lean"}),
                                 callbacks=[monitor])  # fmt: skip
    if attention["training"] != ("lean" if arm == "lean" else None):
        raise SystemExit(f"arm {arm}: lean attention ran as {attention}")
    write_measured(monitor, out)


def rounds_of(yaml_file: Path, arms: list[str], repeats: int, device: str, case_dir: Path) -> list[dict]:
    """Every arm once per round, each round starting with the next arm: no arm always runs first."""
    rounds = []
    for repeat in range(repeats):
        order = arms[repeat % len(arms) :] + arms[: repeat % len(arms)]
        rounds.append({arm: one_run(yaml_file, arm, device, case_dir / f"{arm}-{repeat}", __file__) for arm in order})
    return rounds


def ratio(rounds: list[dict], arm: str, other: str, key: str) -> list[float]:
    return [r[arm][key] / r[other][key] for r in rounds]


def room_for(estimate_bytes: int, device: str) -> bool:
    """Whether a run the memory model puts at ESTIMATE (plus the imports) fits in this machine's memory."""
    if device != "cpu":
        return True
    import psutil

    return estimate_bytes + FRAMEWORK_BYTES < 0.9 * psutil.virtual_memory().available


def case_rows(label: str, cutoff: int, arms: list[str], rounds: list[dict], predicted: dict) -> tuple[list[str], bool]:
    """One row per arm, and whether lean attention met the targets (the memory ones at 4096)."""
    rows, ok = [], True
    for arm in arms:
        gb = statistics.median(r[arm]["training_gb"] for r in rounds)
        estimate_gb = predicted[arm.split(":")[0]].training / GB
        row = (f"{label} {arm:8} {gb:>6.2f} {estimate_gb:>8.2f} {(estimate_gb - gb) / gb:>+6.1%} "
               f"{statistics.median(r[arm]['step_s'] for r in rounds):>7.1f}")  # fmt: skip
        if arm == "lean" and "math" in arms:
            memory, time = ratio(rounds, "lean", "math", "training_gb"), ratio(rounds, "lean", "math", "step_s")
            fused = ratio(rounds, "lean", "fused", "training_gb")
            diff = max(loss_diff(r["lean"], r["math"]) for r in rounds)
            row += f" {spread(memory):>20} {spread(fused):>20} {spread(time):>20} {diff:>9.1e}"
            ok = statistics.median(time) <= TIME_VS_MATH
            if cutoff >= 4096:
                ok = ok and statistics.median(memory) <= MEMORY_VS_MATH and statistics.median(fused) <= MEMORY_VS_FUSED
        elif arm == "lean" and "fused" in arms:  # the math arm did not fit here: no verdict at 4096
            row += f" {'-':>20} {spread(ratio(rounds, 'lean', 'fused', 'training_gb')):>20}"
            ok = cutoff < 4096
        elif arm.startswith("lean:") and arm != arms[0]:
            row += f" {'':>20} {'':>20} {spread(ratio(rounds, arm, arms[0], 'step_s')):>20} (time / {arms[0]})"
        rows.append(row)
    return rows, ok


COLUMNS = [Column("model", "model"), Column("stage", "stage"), Column("cutoff", "cutoff"), Column("ckpt", "ckpt"),
           *(Column(f"{arm} GB", f"{arm}_gb") for arm in ARMS),
           Column("lean / math memory", "lean_math_memory", ".3f"),
           Column("lean / fused memory", "lean_fused_memory", ".3f"),
           *(Column(f"{arm} s/step", f"{arm}_s", ".1f") for arm in ARMS),
           Column("lean / math time", "lean_math_time")]  # fmt: skip
KERNEL_COLUMNS = [Column("arm", "arm"), Column("s", "s"), Column("time / math", "time_vs_math")]


def case_result(model: str, stage: str, cutoff: int, checkpointing: bool, arms: list[str], rounds: list[dict]) -> dict:
    """The results file's row of one case: each arm's medians, lean's ratios per round (None: an arm not run)."""
    row = {"model": "0.5B" if model == "qwen2.5-0.5b" else model, "stage": stage,
           "cutoff": cutoff if stage == "sft" else f"{cutoff} pairs",
           "ckpt": "on" if checkpointing else "off"}  # fmt: skip
    for arm in ARMS:
        ran = arm in arms
        row[f"{arm}_gb"] = statistics.median(r[arm]["training_gb"] for r in rounds) if ran else None
        row[f"{arm}_s"] = statistics.median(r[arm]["step_s"] for r in rounds) if ran else None
    for key, other, figure in (("lean_math_memory", "math", "training_gb"),
                               ("lean_fused_memory", "fused", "training_gb"),
                               ("lean_math_time", "math", "step_s")):  # fmt: skip
        both = "lean" in arms and other in arms
        row[key] = results_file.spread(ratio(rounds, "lean", other, figure)) if both else None
    return row


def table(at: Path | None = None) -> str:
    """docs/lean-paths.md's table of the training runs."""
    results = results_file.load("lean-attention", at)
    return results_file.block(COLUMNS, results)


def kernel_table(at: Path | None = None) -> str:
    """docs/lean-paths.md's table of the attention call alone."""
    results = results_file.load("lean-attention-kernel", at)
    return results_file.block(KERNEL_COLUMNS, results)


KERNEL_LABELS = {"math": "SDPA math (MPS stand-in)", "fused": "fused SDPA (CPU)"}


def kernel_bench(block_mib: list[int], repeats: int, out: Path | None, seq: int = 4096) -> None:
    """Forward and backward of one attention call (Qwen2.5-0.5B's 14 query heads on 2 key/value heads,
    batch 2, float32, causal) on this CPU: SDPA's math path, the fused SDPA, and lean attention with
    each block budget; one untimed call each, then every arm once per round, in a rotated order."""
    import time

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mpskit.engine.lean_attention import lean_attention

    torch.manual_seed(0)
    batch, heads, kv_heads, dim = 2, 14, 2, 64
    q = torch.randn(batch, heads, seq, dim, requires_grad=True)
    k, v = (torch.randn(batch, kv_heads, seq, dim, requires_grad=True) for _ in range(2))

    def sdpa(backends):
        with sdpa_kernel(backends):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    calls = {
        "math": lambda: sdpa([SDPBackend.MATH]),
        "fused": lambda: sdpa([SDPBackend.FLASH_ATTENTION]),
        **{f"lean:{mib}": lambda mib=mib: lean_attention(q, k, v, scaling=dim**-0.5,
                                                          rows=mib * 1024**2 // (4 * batch * heads * seq))
           for mib in block_mib},
    }  # fmt: skip
    names = list(calls)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # untimed: the first call of each allocates and warms up
        calls[name]().sum().backward()
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            started = time.perf_counter()
            calls[name]().sum().backward()
            seconds[name].append(time.perf_counter() - started)
    print(f"attention call, forward and backward: s={seq}, batch {batch}, {heads} heads on {kv_heads}, float32")
    rows = [{"arm": KERNEL_LABELS.get(name, f"lean, {name.split(':')[-1]} MiB blocks"),
             "s": statistics.median(seconds[name]),
             "time_vs_math": results_file.spread([t / m for t, m in zip(seconds[name], seconds["math"], strict=True)])}
            for name in names]  # fmt: skip
    print(results_file.render(KERNEL_COLUMNS, rows))
    if out:
        results_file.save(rows, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the arms per case (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run; the first is not timed")
    parser.add_argument("--case", type=int, action="append", help="only these cases (0-based, see CASES)")
    parser.add_argument("--device", choices=list(HARDWARE), default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--block-mib", type=int, nargs="+", help="only lean arms, with these block budgets (MiB)")
    parser.add_argument("--kernel", action="store_true", help="time the attention call alone (--block-mib sizes)")
    parser.add_argument("--checkpointing", choices=("on", "off"), help="only this checkpointing (default both)")
    parser.add_argument("--out", help="the results file (default: bench/results/lean-attention.json when every "
                        "case ran with its three arms; lean-attention-kernel.json with --kernel and its own blocks)")
    ns = parser.parse_args()
    if ns.repeats < 1:
        parser.error("--repeats must be 1 or more")
    if ns.kernel:
        out = ns.out or (None if ns.block_mib else results_file.path("lean-attention-kernel"))
        kernel_bench(ns.block_mib or [2, 8, 32, 128], max(ns.repeats, 5), Path(out) if out else None)
        return 0
    from mpskit.tools.tiny import build_tiny_model

    chosen = [CASES[i] for i in ns.case] if ns.case else CASES
    ok, results = True, []
    with tempfile.TemporaryDirectory(prefix="mpskit-attention-bench-") as tmp:
        work = Path(tmp)
        data = write_long_data(work / "data")
        names = {model for model, _, _ in chosen}
        models = {name: build_tiny_model(work / name, ROOT / "data", dims=MODELS[name]) for name in names}
        print(f"{'model':12} {'stage':5} {'cutoff':>6} {'ckpt':>4} {'arm':8} {'GB':>6} {'estimate':>8} {'error':>6} "
              f"{'s/step':>7} {'memory / math':>20} {'memory / fused':>20} {'time / math':>20} {'loss diff':>9}",
              flush=True)  # fmt: skip
        for model, stage, cutoff in chosen:
            dims = dims_from_mapping(json.loads((models[model] / "config.json").read_text()))
            for checkpointing in [ns.checkpointing == "on"] if ns.checkpointing else [True, False]:
                label = f"{model:12} {stage:5} {cutoff:>6} {'on' if checkpointing else 'off':>4}"
                predicted = {arm: estimate(dims, arm_knobs(arm, cutoff, checkpointing), stage, ns.device)
                             for arm in ARMS}  # fmt: skip
                arms = []
                for arm in [f"lean:{mib}" for mib in ns.block_mib] if ns.block_mib else ARMS:
                    needs = predicted[arm.split(":")[0]].training
                    if room_for(needs, ns.device):
                        arms.append(arm)
                    else:
                        print(f"{label} {arm:8} skipped: the estimate, {needs / GB:.1f} GB, is more than this "
                              "machine has available", flush=True)  # fmt: skip
                if not arms:
                    continue
                case_dir = work / f"{model}-{stage}-{cutoff}-{'on' if checkpointing else 'off'}"
                case_dir.mkdir()
                # no warm-up: every step after the first moves the weights, so the losses can differ
                extra = (f"disable_gradient_checkpointing={str(not checkpointing).lower()}", "warmup_ratio=0")
                yaml_file = write_yaml(stage, cutoff, 1, models[model], data, case_dir, ns.steps, HARDWARE[ns.device],
                                       extra)  # fmt: skip
                rounds = rounds_of(yaml_file, arms, ns.repeats, ns.device, case_dir)
                rows, met = case_rows(label, cutoff, arms, rounds, predicted)
                print("\n".join(rows), flush=True)
                ok = ok and met
                if not ns.block_mib:
                    results.append(case_result(model, stage, cutoff, checkpointing, arms, rounds))
    print(f"targets: at 4096, lean / math memory <= {MEMORY_VS_MATH}, lean / fused memory <= {MEMORY_VS_FUSED}; "
          f"lean / math step time <= {TIME_VS_MATH}")  # fmt: skip
    whole = not (ns.case or ns.checkpointing or ns.block_mib)
    out = ns.out or (results_file.path("lean-attention") if whole else None)
    if out and results:
        results_file.save(results, Path(out))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
