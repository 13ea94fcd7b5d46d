"""Plots mpskit adds to a run directory (LLaMA-Factory already plots the losses). Each is titled with
the run's stage and model, scaled to its data, with the legend beside the plot, not over it."""

from __future__ import annotations

import json
from pathlib import Path

from mpskit.rundir import RunRecord


def run_title(record: RunRecord) -> str:
    """`dpo of tiny-model on cpu`: what a plot is about, not when it was made."""
    model = Path(str(record.llamafactory_args.get("model_name_or_path", "?"))).name
    return f"{record.stage} of {model} on {record.device}"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_foodpo(run_dir: str | Path, title: str) -> Path | None:
    """dynamic_beta and rewards/margins per logging step -> foodpo_beta_margin.png. The beta axis starts
    at 0, so a beta that barely moves (on short prompts of similar perplexity) looks as flat as it is;
    its range is said in the legend."""
    run_dir = Path(run_dir)
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    rows = [row for row in history if "dynamic_beta" in row and "rewards/margins" in row]
    if not rows:
        return None
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
    out = run_dir / "foodpo_beta_margin.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_memory(
    run_dir: Path,
    samples: list[tuple[float, int]],
    measured: dict,
    predicted_gb: float | None,
    budget_gb: float | None,
    title: str,
) -> Path | None:
    """Training memory over the run (what the process holds above its state before the model loaded:
    the progress line's figure), with the prediction, and the budget where it is on the same scale."""
    if not samples:
        return None
    plt = _pyplot()
    baseline = measured["baseline_gb"]
    fig, axis = plt.subplots(figsize=(9, 4))
    seconds, used = [t for t, _ in samples], [b / 1024**3 - baseline for _, b in samples]
    axis.plot(seconds, used, color="tab:blue", label=f"measured ({measured['device']})")
    peak = measured["training_gb"]
    axis.axhline(peak, color="tab:blue", linestyle=":", label=f"measured peak {peak:.2f} GB")
    if predicted_gb:
        axis.axhline(predicted_gb, color="tab:orange", linestyle="--", linewidth=2, label=f"plan {predicted_gb:.2f} GB")
    top = max(peak, predicted_gb or 0, max(used)) * 1.3 or 1
    if budget_gb and budget_gb <= top * 2:
        axis.axhline(budget_gb, color="tab:red", label=f"budget {budget_gb:.2f} GB")
        top = max(top, budget_gb * 1.1)
    elif budget_gb:
        axis.plot([], [], " ", label=f"budget {budget_gb:.2f} GB (off the scale)")
    axis.set_ylim(min(0, min(used)), top)
    axis.set_xlabel("seconds since the model began to load")
    axis.set_ylabel("GB above the process before loading")
    axis.set_title(f"training memory: {title}")
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    out = Path(run_dir) / "memory.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
