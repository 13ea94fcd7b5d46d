"""The plots of a run directory: loss.png, rewards.png (preference stages), memory.png and, for fooDPO,
foodpo_beta_margin.png. Each is titled with the run's stage and model, scaled to its data, with the
legend beside the plot, not over it. They say only what was measured: a marker on every logged
point, a running mean only beside 30 points or more, a y label always, no offset ticks, and a run
that moved less than the noise of its first steps is called flat. (LLaMA-Factory's own `plot_loss`
smooths as few as 3 points and leaves the y axis unlabelled; mpskit's presets turn it off.)"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from mpskit.rundir.record import FINISHED, Attempt, RunRecord


def run_title(record: RunRecord) -> str:
    """`dpo of tiny-model on cpu`: what a plot is about, not when it was made."""
    args = record.llamafactory_args
    model = Path(str(args.get("model_name_or_path", "?"))).name
    bits = f", {args['quantization_bit']}-bit base" if args.get("quantization_bit") else ""
    return f"{record.stage} of {model}{bits} on {record.device}"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


SMOOTH_FROM = 30  # logged points from which a running mean is drawn beside them
FLAT_FLOOR = 0.01  # a change under 1% of the first steps' level is flat whatever their noise
VERDICT_FROM = 8  # logged points from which a loss is judged: a first and a last quarter of 2 points each


def flatness(values: list[float]) -> tuple[float, float]:
    """(change, noise): the mean of the last quarter of the points minus the first quarter's, and the
    first quarter's spread (at least FLAT_FLOOR of its level). A series is flat where |change| <= noise.
    VERDICT_FROM points at least: the quarters then hold 2 points each and do not overlap."""
    count = len(values) // 4
    first, last = values[:count], values[-count:]
    noise = max(statistics.pstdev(first), FLAT_FLOOR * abs(statistics.fmean(first)))
    return statistics.fmean(last) - statistics.fmean(first), noise


def loss_title(title: str, losses: list[float]) -> str:
    """The loss plot's title: the run, and "flat" where the loss moved less than its first steps' noise
    (no verdict from fewer than VERDICT_FROM points: the demo's preference stages log 2)."""
    if len(losses) < VERDICT_FROM:
        return f"{title}: loss"
    change, noise = flatness(losses)
    flat = f", flat: {change:+.3g} against the first steps' noise {noise:.2g}" if abs(change) <= noise else ""
    return f"{title}: loss{flat}"


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [row for row in history if isinstance(row.get(key), (int, float)) and "step" in row]
    return [row["step"] for row in rows], [float(row[key]) for row in rows]


def _draw(axis, history: list[dict], key: str, label: str, color: str, smooth: bool = True) -> list[float]:
    """One logged series with a marker on every point (and its running mean from SMOOTH_FROM points)."""
    steps, values = _series(history, key)
    if not steps:
        return []
    axis.plot(steps, values, color=color, marker="o", markersize=3, linewidth=1, label=f"{label} ({len(steps)})")
    if smooth and len(values) >= SMOOTH_FROM:
        window = len(values) // 10
        means = [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]
        axis.plot(steps, means, color=color, alpha=0.5, linewidth=3, label=f"{label}, running mean of {window}")
    return values


def _step_axis(axis) -> None:
    """An x axis of optimizer steps, ticked in whole steps."""
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("optimizer step")


def _level_axis(axis, values: list[float], ylabel: str) -> None:
    """Steps along x; no offset ticks, a y label, and a y range at least 4% of the level wide (a flat
    line stays flat)."""
    _step_axis(axis)
    axis.ticklabel_format(axis="y", useOffset=False)
    axis.set_ylabel(ylabel)
    low, high = min(values), max(values)
    pad = max((high - low) * 0.1, 0.02 * abs(statistics.fmean(values)), 1e-6)
    axis.set_ylim(low - pad, high + pad)


def plot_training(run_dir: str | Path, title: str) -> list[str]:
    """loss.png (training and evaluation loss), rewards.png where rewards are logged and
    foodpo_beta_margin.png where a dynamic beta is, from the trainer's log history, read once.
    Returns a line for each plot not drawn, and why."""
    run_dir = Path(run_dir)
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    _plot_foodpo(run_dir, history, title)
    _, losses = _series(history, "loss")
    if len(losses) < 2:
        return [f"{len(losses)} logged training loss point{'s' * (len(losses) != 1)}: no loss.png "
                "(set logging_steps lower to log more)"]  # fmt: skip
    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(9, 4))
    drawn = _draw(axis, history, "loss", "training loss", "tab:blue")
    drawn += _draw(axis, history, "eval_loss", "evaluation loss", "tab:orange")
    _level_axis(axis, drawn, "loss")
    axis.set_title(loss_title(title, losses))
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    fig.savefig(run_dir / "loss.png", dpi=100)
    plt.close(fig)
    if any("rewards/accuracies" in row or "eval_rewards/accuracies" in row for row in history):
        _plot_rewards(run_dir, history, title)
    return []


def _plot_rewards(run_dir: Path, history: list[dict], title: str) -> None:
    """Reward accuracy (on 0..1, ties at the start count as wrong) and margin, training and held out."""
    plt = _pyplot()
    fig, (accuracy, margin) = plt.subplots(1, 2, figsize=(11, 4))
    _draw(accuracy, history, "rewards/accuracies", "training", "tab:blue", smooth=False)
    _draw(accuracy, history, "eval_rewards/accuracies", "held out", "tab:orange", smooth=False)
    accuracy.set_ylim(-0.05, 1.05)
    accuracy.set_ylabel("reward accuracy (chosen above rejected)")
    _step_axis(accuracy)
    margins = _draw(margin, history, "rewards/margins", "training", "tab:blue")
    margins += _draw(margin, history, "eval_rewards/margins", "held out", "tab:orange")
    _level_axis(margin, margins or [0.0], "reward margin (chosen - rejected)")
    for axis in (accuracy, margin):
        axis.legend(loc="best", fontsize="small")
    fig.suptitle(f"{title}: rewards")
    fig.tight_layout()
    fig.savefig(run_dir / "rewards.png", dpi=100)
    plt.close(fig)


def _plot_foodpo(run_dir: Path, history: list[dict], title: str) -> None:
    """dynamic_beta and rewards/margins per logging step -> foodpo_beta_margin.png. The beta axis starts
    at 0, so a beta that barely moves (on short prompts of similar perplexity) looks as flat as it is;
    its range is said in the legend."""
    rows = [row for row in history if "dynamic_beta" in row and "rewards/margins" in row]
    if not rows:
        return
    plt = _pyplot()
    steps, betas = [row["step"] for row in rows], [row["dynamic_beta"] for row in rows]
    low, high = min(betas), max(betas)
    fig, beta_axis = plt.subplots(figsize=(9, 4))
    spread = f"{low:.4g} to {high:.4g} ({(high - low) / high:.2%} apart)" if high else "0"
    beta_axis.plot(steps, betas, color="tab:blue", marker=".", label=f"dynamic beta, batch mean: {spread}")
    beta_axis.set_ylim(0, high * 1.25 or 1)
    beta_axis.set_xlabel("optimizer step")
    beta_axis.set_ylabel("dynamic beta (batch mean)", color="tab:blue")
    margin_axis = beta_axis.twinx()
    margin_axis.plot(steps, [row["rewards/margins"] for row in rows], color="tab:orange", marker=".",
                     label="reward margin (chosen - rejected)")  # fmt: skip
    margin_axis.set_ylabel("reward margin", color="tab:orange")
    beta_axis.set_title(f"{title}: dynamic beta and reward margin")
    fig.legend(loc="lower center", ncol=2, fontsize="small")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(run_dir / "foodpo_beta_margin.png", dpi=100)
    plt.close(fig)


def plot_memory(run_dir: Path, attempts: list[Attempt], predicted_gb: float | None, budget_gb: float | None,
                title: str) -> Path | None:  # fmt: skip
    """Training memory over every attempt of the run, one after another on one time axis (what the
    process holds above its state before the model loaded: the progress line's figure): loading
    shaded grey, evaluations orange, a line where each attempt after the first begins; each attempt's
    plan (PREDICTED_GB for a record from before attempts kept theirs), and the budget where it is on
    the same scale."""
    shown = [attempt for attempt in attempts if attempt.measured and attempt.measured.samples_gb]
    if not shown:
        return None
    plt = _pyplot()
    fig, axis = plt.subplots(figsize=(9, 4))
    offset, used, labelled = 0.0, [], set()

    def once(label: str) -> str | None:  # each label in the legend once, whatever the attempts
        new = label not in labelled
        labelled.add(label)
        return label if new else None

    peak, plans = 0.0, []
    for attempt in shown:
        measured = attempt.measured
        seconds = [offset + t for t, _ in measured.samples_gb]
        values = [gb for _, gb in measured.samples_gb]
        axis.plot(seconds, values, color="tab:blue", label=once(f"measured ({measured.device})"))
        peak = max(peak, measured.training_gb)
        if plan := attempt.predicted_gb or predicted_gb:
            axis.hlines(plan, seconds[0], seconds[-1], color="tab:orange", linestyle="--", linewidth=2,
                        label=once(f"plan {plan:.2f} GB"))  # fmt: skip
            plans.append(plan)
        if measured.train_began_s is not None:
            axis.axvspan(offset, offset + measured.train_began_s, color="0.88", label=once("loading"))
        for begin, end in measured.eval_spans_s:
            axis.axvspan(offset + begin, offset + end, color="tab:orange", alpha=0.25, label=once("evaluation"))
        if len(shown) > 1:
            where = f" from {attempt.resumed_from}" if attempt.resumed_from else ""
            axis.axvline(offset, color="0.3", linestyle="-.", linewidth=1, label=once("an attempt begins"))
            axis.annotate(f" attempt {attempt.attempt}{where}", (offset, 1), xycoords=("data", "axes fraction"),
                          va="top", fontsize="small")  # fmt: skip
        if attempt.outcome not in ("", FINISHED):  # where it ended early, and how
            axis.plot(seconds[-1], values[-1], "x", color="tab:red", markersize=9, label=once("an attempt ends early"))
            axis.annotate(f" {attempt.outcome[:48]}", (seconds[-1], values[-1]), color="tab:red", fontsize="small")
        used += values
        offset = seconds[-1] + 1.0
    axis.axhline(peak, color="tab:blue", linestyle=":", label=f"measured peak {peak:.2f} GB")
    top = max(peak, *plans, max(used)) * 1.3 or 1
    if budget_gb and budget_gb <= top * 2:
        axis.axhline(budget_gb, color="tab:red", label=f"budget {budget_gb:.2f} GB")
        top = max(top, budget_gb * 1.1)
    elif budget_gb:
        axis.plot([], [], " ", label=f"budget {budget_gb:.2f} GB (off the scale)")
    axis.set_ylim(min(0, min(used)), top)
    several = " (attempts one after another)" if len(shown) > 1 else ""
    axis.set_xlabel(f"seconds since the model began to load{several}")
    axis.set_ylabel("GB above the process before loading")
    missing = len(attempts) - len(shown)
    left_out = f"\n({missing} of {len(attempts)} attempts left no samples)" if missing else ""
    axis.set_title(f"training memory: {title}{left_out}")
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    out = Path(run_dir) / "memory.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
