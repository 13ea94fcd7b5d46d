"""`mpskit compare`: a table (CSV and Markdown) and one plot over finished DPO / fooDPO runs.

Runs are compared on what does not scale with beta: held-out reward accuracy and the log-ratio gap
(the reward margin with beta factored out). The margin itself is beta times the gap, so DPO at 0.1
and fooDPO at a dynamic beta near 0.035 would rank by beta, not by what they learnt."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from mpskit.errors import MpskitError
from mpskit.files import cannot_write, writing
from mpskit.rundir.folder import RunDir
from mpskit.settings.run_spec import RunSpec

SCALE = "pref_beta_scale"  # the column named after fooDPO's setting (read from the run's RunSpec)
COLUMNS = ("run", "stage", SCALE, "final_train_loss", "eval_rewards/accuracies",
           "eval_rewards/log_ratio_gap", "eval_rewards/margins", "mean_dynamic_beta")  # fmt: skip


def summarise_run(run_dir: Path) -> dict:
    run = RunDir.open(run_dir)
    record, results = run.record, run.results()
    if not results or not run.finished:
        how = record.attempts[-1].outcome if record.attempts else "never trained"
        raise MpskitError(f"{run.path} did not finish ({how})", f"finish it first: mpskit train --resume {run.path}")
    if "eval_rewards/accuracies" not in results:  # trained without held-out pairs: what `mpskit eval` scored
        results = {**results, **run.newest_evaluation()}
    args = record.llamafactory_args
    train_rows = [row for row in run.log() if "loss" in row]
    betas = [row["dynamic_beta"] for row in train_rows if "dynamic_beta" in row]
    return {
        "run": f"{run_dir.parent.name}/{run_dir.name}",
        "stage": record.stage,
        SCALE: foodpo.pref_beta_scale if (foodpo := RunSpec.of(args).foodpo) else "-",
        "final_train_loss": train_rows[-1]["loss"] if train_rows else float("nan"),
        "eval_rewards/accuracies": results.get("eval_rewards/accuracies"),
        "eval_rewards/log_ratio_gap": _log_ratio_gap(results, record.stage, args),
        "eval_rewards/margins": results.get("eval_rewards/margins"),
        "mean_dynamic_beta": statistics.fmean(betas) if betas else args.get("pref_beta"),
        "_losses": [(row["current_steps"], row["loss"]) for row in train_rows],
    }


def _log_ratio_gap(results: dict, stage: str, args: dict) -> float | None:
    """The held-out log-ratio gap as the trainer logged it; for a DPO run from before it was logged,
    its margin over its one beta (exact for a fixed beta)."""
    if "eval_rewards/log_ratio_gap" in results:
        return results["eval_rewards/log_ratio_gap"]
    margin = results.get("eval_rewards/margins")
    if stage == "dpo" and isinstance(margin, (int, float)):
        return margin / float(args.get("pref_beta", 0.1))
    return None


def _cell(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def markdown_table(columns: tuple[str, ...], rows: list[dict]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


OUTPUTS = ("comparison.csv", "comparison.md", "comparison.png")


def compare(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    out = Path(out_dir)
    with writing(out, "--out", "mpskit compare"):
        return _write_comparison(run_dirs, out)


def _write_comparison(run_dirs: list[str | Path], out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise MpskitError(f"{out} is a file", "give --out a folder")
    there = [name for name in OUTPUTS if (out / name).exists() or (out / name).is_symlink()]
    if there:
        raise MpskitError(f"{out} already holds {', '.join(there)}", "give --out a new folder; mpskit never overwrites")
    runs = [summarise_run(Path(d).resolve()) for d in run_dirs]
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "comparison.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows([[run[c] for c in COLUMNS] for run in runs])
        (out / "comparison.md").write_text(markdown_table(COLUMNS, runs))
        _plot(runs, out / "comparison.png")
    except OSError as err:
        raise cannot_write(out, err, "--out") from None
    return out


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_axis, accuracy_axis, gap_axis) = plt.subplots(1, 3, figsize=(15, 4))
    labels = distinct_labels(runs)
    for run, label in zip(runs, labels, strict=True):
        steps, losses = zip(*run["_losses"], strict=True) if run["_losses"] else ((), ())
        loss_axis.plot(steps, losses, marker="o", markersize=3, label=label)
    loss_axis.set_xlabel("optimizer step")
    loss_axis.set_ylabel("train loss")
    loss_axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize="small")  # below: off the lines
    for axis, key, ylabel, color in (
        (accuracy_axis, "eval_rewards/accuracies", "held-out reward accuracy", "tab:green"),
        (gap_axis, "eval_rewards/log_ratio_gap", "held-out log-ratio gap (margin / beta)", "tab:orange"),
    ):
        values = [run[key] for run in runs]
        axis.bar(range(len(runs)), [v or 0.0 for v in values], color=color)
        for i, value in enumerate(values):
            axis.annotate("n/a" if value is None else f"{value:.3g}", (i, value or 0.0), ha="center", va="bottom",
                          fontsize="small")  # fmt: skip
        axis.set_xticks(range(len(runs)), labels, rotation=20, ha="right", fontsize="small")
        axis.set_ylabel(ylabel)
    accuracy_axis.set_ylim(0, 1.1)
    fig.suptitle("DPO vs fooDPO by pref_beta_scale: what they learnt, with beta factored out")
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def distinct_labels(runs: list[dict]) -> list[str]:
    """One label per run: its stage (fooDPO with its pref_beta_scale), and its run name where two
    would otherwise read the same, then its place in the list where even that repeats."""
    kinds = [run["stage"] if run["stage"] != "foodpo" else f"foodpo scale {run[SCALE]}" for run in runs]
    labels = [
        kind if kinds.count(kind) == 1 else f"{kind} ({run['run']})" for kind, run in zip(kinds, runs, strict=True)
    ]
    return [label if labels.count(label) == 1 else f"{label} #{i + 1}" for i, label in enumerate(labels)]
