"""The real model, measured: SmolLM2-135M-Instruct (`mpskit get-model smollm2-135m`) through `mpskit train`.

Sections (all by default; --only picks one), each case in a fresh process, rounds interleaved so a busy
spell of the machine lands on every case, medians and spread over the rounds:
  memory   SFT and DPO (fooDPO once), 16 and 4 bits, the project's real data, rows that fill cutoff_len and
           rows whose prompts fill it under answers of a word or two,
           held-out evaluation on: the plan's training-step and evaluation peaks against the monitor's
           (mpskit.json: the peaks of steps and of evaluations are kept apart), and the plan's optimizer
           step against the measured steady step (hardware profile `cpu`). Cases marked `fit` set the
           memory model's constants and the profile's figures; the others are held out of that fit.
  quality  identity SFT at the demo's settings in 16 and 4 bits, and in 4 bits with the embeddings and
           output layer packed too (quantize_embeddings), same data and seed: the held-out loss before, along
           and after training, and the steady step (what 4-bit weights cost a real model).
  foodpo   DPO against fooDPO on checked_pref over 3 seeds: held-out reward accuracy and log-ratio gap.
  engine   `mpskit train` against plain `llamafactory-cli train` of the YAML mpskit wrote: the steady
           training time a step (the trainer's train_runtime: evaluations included, in both) and the
           process's peak RSS (whole process, imports included, for both).

    python bench/real.py [--only memory|quality|foodpo|engine] [--repeats 3] [--hardware cpu|detect] [--out FILE.json]
    (the docs' tables render bench/results/real-memory-cpu.json and real-memory-h200.json: --only memory --out)
    python bench/real.py --replan FILE.json      (the memory table of saved runs against the current plans)

Targets: memory median |error| <= 5%, maximum <= 12% (steps and evaluations apart); step time within 25%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import results_file  # noqa: E402
from results_file import Column  # noqa: E402

from mpskit.plan.advice import plan_duration, plan_run  # noqa: E402
from mpskit.plan.duration import Throughput, steady_step_s  # noqa: E402
from mpskit.plan.memory import GB  # noqa: E402
from mpskit.plan.planner import Plan  # noqa: E402
from mpskit.presets import model_folder  # noqa: E402
from mpskit.rundir.folder import RunDir  # noqa: E402
from mpskit.settings.resolve import ResolvedRun, resolve  # noqa: E402
from mpskit.settings.run_words import read_run_words  # noqa: E402
from mpskit.tools.demo import STAGE_WORDS  # noqa: E402
from mpskit.trials.measure import OFFLINE, fresh_process_env, train_in_fresh_process, write_long_data  # noqa: E402
from mpskit.trials.time_fit import FITTED, TimedStep, fit_figures  # noqa: E402

DATA = ROOT / "data"
PRESET = "smollm2-135m"
MEMORY_TARGETS = (0.05, 0.12)
TIME_TARGET = 0.25
HARDWARE = ["hardware=cpu"]  # the runs' hardware profile words; --hardware detect: none (the machine's own)
SFT_STEPS = int(next(word for word in STAGE_WORDS["sft"] if word.startswith("max_steps=")).split("=")[1])


@dataclass(frozen=True)
class Case:
    stage: str
    bits: int  # 16: the bf16 checkpoint as it is; 4: quantization_bit=4
    # "real": identity / checked_pref (rows of about 60 tokens); "long": rows that fill cutoff_len;
    # "long-prompt": prompts that fill it and answers of a word or two (the held-out peak is a layer's forward)
    data: str
    cutoff: int
    batch: int
    checkpointing: bool
    eval_batch: int
    fit: bool  # used to set the constants (else held out of that fit)
    steps: int = 6

    @property
    def name(self) -> str:
        ckpt = "ckpt" if self.checkpointing else "no-ckpt"
        return f"{self.stage} {self.bits}-bit {self.data} {self.cutoff}x{self.batch} {ckpt} eval {self.eval_batch}"


MEMORY_CASES = [
    Case("sft", 16, "real", 256, 4, False, 8, fit=True),
    Case("sft", 4, "real", 256, 4, False, 8, fit=True),
    Case("dpo", 16, "real", 256, 4, False, 8, fit=True),
    Case("dpo", 4, "real", 256, 4, False, 8, fit=False),
    Case("sft", 16, "long", 512, 2, True, 4, fit=True),
    Case("sft", 4, "long", 512, 2, False, 4, fit=False),
    Case("dpo", 16, "long", 256, 2, False, 4, fit=False),
    Case("dpo", 4, "long", 256, 1, True, 2, fit=True),
    Case("foodpo", 16, "long", 256, 2, True, 2, fit=False),
    Case("sft", 16, "long-prompt", 512, 2, False, 8, fit=True),
    Case("sft", 4, "long-prompt", 512, 2, False, 8, fit=True),
]
DATASETS = {("sft", "real"): ("identity", "identity_eval"), ("pref", "real"): ("checked_pref", "checked_pref_eval"),
            ("sft", "long"): ("long_sft", "long_sft"), ("pref", "long"): ("long_pref", "long_pref"),
            ("sft", "long-prompt"): ("long_prompt_sft", "long_prompt_sft")}  # fmt: skip


def data_dirs(long: Path) -> dict[str, Path]:
    """Each case's dataset_dir: the project's data, or the rows written for the bench (write_long_data)."""
    written = write_long_data(long)
    return {"real": DATA, "long": written, "long-prompt": written}


def model() -> Path:
    folder = model_folder(PRESET)
    if not (folder / "config.json").is_file():
        raise SystemExit(f"mpskit: error: the real model is not in {folder}; fetch it: mpskit get-model {PRESET}")
    return folder


def case_words(case: Case, data: dict[str, Path], out: Path) -> list[str]:
    kind = "sft" if case.stage == "sft" else "pref"
    train, held_out = DATASETS[(kind, case.data)]
    words = [
        f"preset={case.stage}", f"stage={case.stage}", f"model_preset={PRESET}", f"dataset_dir={data[case.data]}",
        f"dataset={train}", f"eval_dataset={held_out}", f"cutoff_len={case.cutoff}",
        f"per_device_train_batch_size={case.batch}", "gradient_accumulation_steps=1", "lora_rank=8",
        f"disable_gradient_checkpointing={str(not case.checkpointing).lower()}",
        f"per_device_eval_batch_size={case.eval_batch}", f"max_steps={case.steps}", "eval_strategy=steps",
        f"eval_steps={case.steps // 2}", "logging_steps=1", "save_strategy=no", "learning_rate=5e-4",
        *HARDWARE, "memory_budget_gb=1000", f"output_dir={out}",
    ]  # fmt: skip
    return words + (["quantization_bit=4"] if case.bits == 4 else [])


def measure_case(case: Case, data: dict[str, Path], out: Path) -> dict:
    """One run of the case: the monitor's peaks of training steps and of evaluations, the steady step."""
    train_in_fresh_process(case_words(case, data, out), f"bench case {case.name}", f"see {out}", OFFLINE)
    measured = RunDir.open(out).record.memory.measured
    return {"step": measured.step_gb, "eval": measured.eval_gb, "time": steady_step_s(measured.step_seconds)}


def planned(case: Case, data: dict[str, Path]) -> tuple[ResolvedRun, Plan]:
    """The case as `mpskit train` resolves and plans it (no torch: the current code's plan, so --replan
    shows saved measurements against changed constants)."""
    given = read_run_words(case_words(case, data, Path(tempfile.gettempdir()) / "unwritten"))
    run = resolve(given.values, hardware=given.hardware)
    return run, plan_run(run)


def plan_case(case: Case, data: dict[str, Path]) -> dict:
    """The plan's figures for the case."""
    run, plan = planned(case, data)
    estimate = plan.chosen.estimate
    return {"step": estimate.step / GB, "eval": estimate.evaluation / GB,
            "time": plan_duration(run, plan).as_dict()["predicted_step_s"]}  # fmt: skip


def error(plan: float, measured: float) -> float:
    return (plan - measured) / measured


def spread(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def run_memory(repeats: int, work: Path) -> dict:
    data = data_dirs(work / "long")
    rounds: list[list[dict]] = [[] for _ in MEMORY_CASES]
    for repeat in range(repeats):
        order = list(enumerate(MEMORY_CASES))
        for i, case in order if repeat % 2 == 0 else order[::-1]:
            rounds[i].append(measure_case(case, data, work / f"memory-{i}-{repeat}"))
            print(f"round {repeat + 1} {case.name}: {json.dumps(rounds[i][-1])}", flush=True)
    return memory_table({case.name: runs for case, runs in zip(MEMORY_CASES, rounds, strict=True)}, data)


def memory_table(measured: dict[str, list[dict]], data: dict[str, Path]) -> dict:
    """Each case's plan (the current code's) against the median of its measured runs."""
    print(f"\n{'case':44} {'fit':4} {'step GB: plan / measured':>26} {'error':>7} {'eval GB: plan / measured':>26} "
          f"{'error':>7} {'step s: plan / measured':>26} {'error':>7}")  # fmt: skip
    rows = []
    for case in MEMORY_CASES:
        runs, plan = measured[case.name], plan_case(case, data)
        row = {"case": case.name, "fit": case.fit, "runs": runs}
        cells = []
        for key in ("step", "eval", "time"):
            median = statistics.median(run[key] for run in runs)
            row[key] = {"plan": plan[key], "measured": median,
                        "error": None if plan[key] is None else error(plan[key], median)}  # fmt: skip
            said = "unknown / " if plan[key] is None else f"{plan[key]:>8.3f} / "  # no measured figure backs one
            cells.append(f"{said:>11}{spread([run[key] for run in runs]):>15} " +
                         ("      -" if plan[key] is None else f"{row[key]['error']:>+7.1%}"))  # fmt: skip
        rows.append(row)
        print(f"{case.name:44} {'yes' if case.fit else 'no':4} " + " ".join(cells))
    for line in summary_lines(rows):
        print(line)
    return {"cases": rows}


def fitted_figures(measured: dict[str, list[dict]], data: dict[str, Path]) -> Throughput:
    """The profile's step-time figures for real checkpoints fitted to the fit cases' median steady steps
    (time_fit.py); the held-out cases test them."""
    steps = []
    for case in (case for case in MEMORY_CASES if case.fit):
        run, plan = planned(case, data)
        seconds = statistics.median(run_["time"] for run_ in measured[case.name])
        steps.append(TimedStep(run.args, run.stage, plan.dims, plan.chosen.knobs, plan.effective_batch,
                               plan.lengths, seconds))  # fmt: skip
    figures = fit_figures(steps, plan.throughput, "fitted by bench/real.py --fit")  # every case's profile
    print("fitted: " + ", ".join(f"{name}: {getattr(figures, name):.3g}" for name in FITTED))
    return figures


def losses(run_dir: Path, key: str) -> list[tuple[int, float]]:
    return [(row["current_steps"], row[key]) for row in RunDir.open(run_dir).log() if key in row]


def train_demo_stage(words: list[str], out: Path) -> RunDir:
    train_in_fresh_process([*words, f"output_dir={out}", *HARDWARE], f"bench run {words[0]}", f"see {out}", OFFLINE)
    return RunDir.open(out)


def run_quality(repeats: int, work: Path) -> dict:
    """Identity SFT at the demo's settings, 16 bits, 4 bits, and 4 bits with the (tied) embeddings and
    output layer packed too (quantize_embeddings), one seed per round, the arms' order turning round by round."""
    from mpskit.tools.demo import stage_words

    arms = {"16-bit": [], "4-bit": ["quantization_bit=4"],
            "4-bit packed": ["quantization_bit=4", "quantize_embeddings=true"]}  # fmt: skip
    curves: dict[str, list[list[tuple[int, float]]]] = {arm: [] for arm in arms}
    steps_s: dict[str, list[float]] = {arm: [] for arm in arms}
    for repeat in range(repeats):
        order = list(arms)[repeat % len(arms) :] + list(arms)[: repeat % len(arms)]
        for arm in order:
            words = [*stage_words("sft"), f"seed={repeat}", *arms[arm]]
            run = train_demo_stage(words, work / f"quality-{arm.replace(' ', '-')}-{repeat}")
            curves[arm].append(losses(run.path, "eval_loss"))
            steps_s[arm].append(steady_step_s(run.record.memory.measured.step_seconds))
            said = f"held-out loss {curves[arm][-1]}, step {steps_s[arm][-1]:.2f} s"
            print(f"round {repeat + 1} {arm}: {said}", flush=True)
    rows = [{"base": QUALITY_LABELS[arm], "before": results_file.spread([run[0][1] for run in runs]),
             "last_but_one": results_file.spread([run[-2][1] for run in runs]),
             "end": results_file.spread([run[-1][1] for run in runs])} for arm, runs in curves.items()]  # fmt: skip
    summary = {}
    for arm, runs in curves.items():
        steps = [step for step, _ in runs[0]]
        summary[arm] = {step: statistics.median(run[i][1] for run in runs) for i, step in enumerate(steps)}
        line = ", ".join(f"step {step} {value:.3f}" for step, value in summary[arm].items())
        ends = [run[-1][1] for run in runs]
        print(f"{arm}: held-out loss (median of {repeats} seeds) {line}; at the end {spread(ends)}; "
              f"step {spread(steps_s[arm], 2)} s")  # fmt: skip
    return {"held_out_loss": summary, "step_s": steps_s, "rows": rows}


def run_foodpo(seeds: int, work: Path) -> dict:
    """DPO against fooDPO at the demo's settings on checked_pref, one seed a round."""
    from mpskit.tools.demo import stage_words

    figures: dict[str, list[dict]] = {"dpo": [], "foodpo": []}
    for seed in range(seeds):
        for stage in figures if seed % 2 == 0 else list(figures)[::-1]:
            run = train_demo_stage([*stage_words(stage), f"seed={seed}"], work / f"foodpo-{stage}-{seed}")
            results = run.results()
            figures[stage].append({"accuracy": results["eval_rewards/accuracies"],
                                   "gap": results["eval_rewards/log_ratio_gap"]})  # fmt: skip
            print(f"seed {seed} {stage}: {figures[stage][-1]}", flush=True)
    for stage, runs in figures.items():
        print(f"{stage}: held-out accuracy {spread([r['accuracy'] for r in runs])}, "
              f"log-ratio gap {spread([r['gap'] for r in runs], 2)} over {seeds} seeds")  # fmt: skip
    rows = [{"stage": FOODPO_LABELS[stage], **results_file.spreads(runs)} for stage, runs in figures.items()]
    return {**figures, "rows": rows}


def peak_rss_gb(command: list[str], env: dict[str, str]) -> float:
    """Run COMMAND to its end; the whole process's peak RSS (its own, from wait4)."""
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    stderr = child.stderr.read()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"mpskit: error: {' '.join(command[:4])} failed: {stderr.strip()[-300:]}")
    return usage.ru_maxrss * 1024 / 1024**3


def run_engine(repeats: int, work: Path) -> dict:
    """The demo's SFT through mpskit and the YAML it wrote through plain llamafactory-cli, in turn."""
    from mpskit.tools.demo import stage_words

    env = fresh_process_env(OFFLINE)
    mpskit_cli = [sys.executable, "-m", "mpskit.cli", "train", *stage_words("sft"), *HARDWARE]
    plain_cli = [sys.executable, "-m", "llamafactory.cli", "train"]
    arms: dict[str, list[dict]] = {"mpskit": [], "llamafactory-cli": []}
    yaml = None  # the YAML of the first round's mpskit run, which runs first
    for repeat in range(repeats):
        for arm in arms if repeat % 2 == 0 else list(arms)[::-1]:
            out = work / f"engine-{arm}-{repeat}"
            if arm == "mpskit":
                peak = peak_rss_gb([*mpskit_cli, f"output_dir={out}"], env)
                yaml = yaml or out / "llamafactory.yaml"
            else:
                peak = peak_rss_gb([*plain_cli, str(yaml), f"output_dir={out}"], env)
            results = json.loads((out / "all_results.json").read_text())  # the trainer's own, in both
            arms[arm].append({"peak_gb": peak, "step_s": results["train_runtime"] / SFT_STEPS})
            print(f"round {repeat + 1} {arm}: {arms[arm][-1]}", flush=True)
    for arm, runs in arms.items():
        print(f"{arm}: training {spread([r['step_s'] for r in runs])} s a step, process peak RSS "
              f"{spread([r['peak_gb'] for r in runs])} GB")  # fmt: skip
    rows = [{"command": ENGINE_LABELS[arm], **results_file.spreads(runs)}
            for arm, runs in arms.items()]  # fmt: skip
    return {**arms, "rows": rows}


SECTIONS = {"memory": run_memory, "quality": run_quality, "foodpo": run_foodpo, "engine": run_engine}
QUALITY_LABELS = {"16-bit": "16-bit (bf16)", "4-bit": "4-bit (NF4)", "4-bit packed": "4-bit, tables packed"}
FOODPO_LABELS = {"dpo": "DPO (beta 0.1)", "foodpo": "fooDPO (beta 0.1 x 0.05 x log PPL)"}
ENGINE_LABELS = {"mpskit": "mpskit train", "llamafactory-cli": "llamafactory-cli train"}
# The columns of the other sections' tables in docs/real-model.md; each file is bench/results/real-SECTION.json.
SECTION_COLUMNS = {
    "quality": [Column("base", "base"), Column("before training", "before", ".3f"),
                Column("the evaluation before the last", "last_but_one", ".3f"), Column("end", "end", ".3f")],
    "foodpo": [Column("stage", "stage"), Column("held-out reward accuracy", "accuracy", ".3f"),
               Column("held-out log-ratio gap", "gap", ".2f")],
    "engine": [Column("", "command"), Column("s a step", "step_s", ".3f"),
               Column("process peak RSS GB", "peak_gb", ".3f")],
}  # fmt: skip


def engine_said(rows: list[dict]) -> str:
    ours, plain = ({key: row[key]["median"] for key in ("step_s", "peak_gb")} for row in rows)
    return (f"mpskit's step takes {ours['step_s'] / plain['step_s']:.2f}x plain LLaMA-Factory's, and its process "
            f"holds {plain['peak_gb'] - ours['peak_gb']:.2f} GB less.")  # fmt: skip


def quality_said(rows: list[dict]) -> str:
    before = [row["before"]["median"] if isinstance(row["before"], dict) else row["before"] for row in rows]
    ends = [row["end"]["median"] for row in rows]
    return (f"Quantizing the base costs {before[1] - before[0]:.2f} nats on these answers before training, and "
            f"packing its embeddings and output layer {before[2] - before[1]:.2f} more. After training the three "
            f"end within {max(ends) - min(ends):.2f} of each other.")  # fmt: skip


SECTION_SAID = {"engine": engine_said, "quality": quality_said}


def section_table(name: str, at: Path | None = None) -> str:
    """docs/real-model.md's table of one section's results: medians and [range] over the seeds or rounds."""
    results = results_file.load(f"real-{name}", at)
    said = [SECTION_SAID[name](results["rows"])] if name in SECTION_SAID else []
    return results_file.block(SECTION_COLUMNS[name], results, *said)

# The memory section's results the docs render (scripts/docs_tables.py): this CPU's, and one H200's.
CPU_RESULTS = results_file.path("real-memory-cpu")
H200_RESULTS = results_file.path("real-memory-h200")
README_CASES = 4  # the demo's data: SFT and DPO in 16 and 4 bits


def _results(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["memory"]["cases"]


def _figure(row: dict, key: str, digits: int = 3, ranged: bool = True) -> str:
    """plan / measured (the runs' range)."""
    figure, runs = row[key], [run[key] for run in row["runs"]]
    plan = "unknown" if figure["plan"] is None else f"{figure['plan']:.{digits}f}"
    spread_ = f" ({min(runs):.{digits}f}-{max(runs):.{digits}f})" if ranged and len(runs) > 1 else ""
    return f"{plan} / {figure['measured']:.{digits}f}{spread_}"


def _error(row: dict, key: str) -> str:
    return "-" if row[key]["error"] is None else f"{row[key]['error']:+.1%}"


def _memory_errors(rows: list[dict]) -> list[float]:
    return [abs(row[key]["error"]) for row in rows for key in ("step", "eval")]


def summary_lines(rows: list[dict]) -> list[str]:
    """The median and largest errors, fitted and held-out cases apart: the bench's last lines, and the
    docs' (cpu_table)."""
    said = []
    for group, selected in (("fitted", [r for r in rows if r["fit"]]), ("held out", [r for r in rows if not r["fit"]])):
        if not selected:
            continue
        memory = _memory_errors(selected)
        line = f"{group}: memory median |error| {statistics.median(memory):.1%}, max {max(memory):.1%}"
        step_errors = [abs(r["time"]["error"]) for r in selected if r["time"]["error"] is not None]
        said.append(line + (f"; step time max |error| {max(step_errors):.1%}" if step_errors else ""))
    return said


def cpu_table(path: Path = CPU_RESULTS) -> str:
    """docs/real-model.md's table: every case of this CPU's results, with the runs' ranges."""
    rows = _results(path)
    lines = ["| case (SmolLM2-135M, CPU) | fitted on | training step GB: plan / measured (range) | error | "
             "evaluation GB: plan / measured (range) | error | step s: plan / measured (range) | error |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['case']} | {'yes' if r['fit'] else 'no'} | {_figure(r, 'step')} | {_error(r, 'step')} | "
              f"{_figure(r, 'eval')} | {_error(r, 'eval')} | {_figure(r, 'time', 2)} | {_error(r, 'time')} |"
              for r in rows]  # fmt: skip
    return "\n".join([*lines, "", f"Medians of the rounds; {'; '.join(summary_lines(rows))}."])


def readme_table(path: Path = CPU_RESULTS) -> str:
    """README's short table: the demo's data, SFT and DPO in 16 and 4 bits, and the errors of every case."""
    rows = _results(path)
    lines = ["| case | training step GB: plan / measured | evaluation GB: plan / measured | step s: plan / measured |",
             "|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['case']} | {_figure(r, 'step', 2, False)} ({_error(r, 'step')}) | "
              f"{_figure(r, 'eval', 2, False)} ({_error(r, 'eval')}) | {_figure(r, 'time', 2, False)} "
              f"({_error(r, 'time')}) |" for r in rows[:README_CASES]]  # fmt: skip
    memory = _memory_errors(rows)
    return "\n".join([*lines, "", f"Over all {len(rows)} cases, memory median |error| {statistics.median(memory):.1%}, "
                      f"max {max(memory):.1%}."])  # fmt: skip


def h200_table(path: Path = H200_RESULTS) -> str:
    """docs/real-model.md's CUDA table: one round on an H200 (the plan's step time is CUDA's default)."""
    rows = _results(path)
    lines = ["| case (SmolLM2-135M, CUDA) | training step GB: plan / measured | error | evaluation GB: plan / measured "
             "| error | step s measured |", "|---|---|---|---|---|---|"]  # fmt: skip
    lines += [f"| {r['case']} | {_figure(r, 'step', 3, False)} | {_error(r, 'step')} | {_figure(r, 'eval', 3, False)} "
              f"| {_error(r, 'eval')} | {r['time']['measured']:.3f} |" for r in rows]  # fmt: skip
    memory = _memory_errors(rows)
    return "\n".join([*lines, "", f"Every training step and evaluation within {max(memory):.1%} "
                      f"(median {statistics.median(memory):.1%})."])  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(SECTIONS), action="append", help="one section (repeatable)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (fooDPO: seeds), default 3")
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--hardware", default="cpu", help="hardware profile of the runs, or 'detect' (default: cpu)")
    parser.add_argument("--replan", metavar="FILE", help="no runs: the memory table of a saved --out file against "
                        "the current code's plans (after a change of the memory model's constants)")
    parser.add_argument("--fit", action="store_true", help="with --replan: the profile's step-time figures for real "
                        "checkpoints fitted to the fit cases' steps (write them into the profile's throughput)")
    ns = parser.parse_args()
    HARDWARE[:] = [] if ns.hardware == "detect" else [f"hardware={ns.hardware}"]
    if ns.replan:
        with tempfile.TemporaryDirectory(prefix="mpskit-bench-real-") as tmp:
            saved = json.loads(Path(ns.replan).read_text())["memory"]["cases"]
            data = data_dirs(Path(tmp))
            measured = {row["case"]: row["runs"] for row in saved}
            if ns.fit:
                fitted_figures(measured, data)
            memory_table(measured, data)
        return 0
    model()
    results = {}
    with tempfile.TemporaryDirectory(prefix="mpskit-bench-real-") as tmp:
        for name in ns.only or list(SECTIONS):
            print(f"\n== {name}", flush=True)
            results[name] = SECTIONS[name](ns.repeats, Path(tmp))
    if ns.out:
        Path(ns.out).write_text(json.dumps({**results_file.provenance(), **results}, indent=2))
    cpu_sections = [name for name in results if name in SECTION_COLUMNS and ns.hardware == "cpu"]
    for name in cpu_sections:  # the docs' tables (scripts/docs_tables.py)
        rows = results[name].pop("rows")
        results_file.save(rows, results_file.path(f"real-{name}"), **{name: results[name]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
