"""Plots mpskit adds to a run directory (LLaMA-Factory already plots the losses)."""

from __future__ import annotations

import json
from pathlib import Path


def plot_foodpo(run_dir: str | Path) -> Path | None:
    """dynamic_beta and rewards/margins per logging step -> foodpo_beta_margin.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    rows = [row for row in history if "dynamic_beta" in row and "rewards/margins" in row]
    if not rows:
        return None
    steps = [row["step"] for row in rows]
    fig, beta_axis = plt.subplots(figsize=(7, 4))
    beta_axis.plot(steps, [row["dynamic_beta"] for row in rows], color="tab:blue", label="dynamic beta (mean)")
    beta_axis.set_xlabel("step")
    beta_axis.set_ylabel("dynamic beta", color="tab:blue")
    margin_axis = beta_axis.twinx()
    margin_axis.plot(steps, [row["rewards/margins"] for row in rows], color="tab:orange", label="reward margin")
    margin_axis.set_ylabel("reward margin", color="tab:orange")
    beta_axis.set_title(f"fooDPO: {run_dir.name}")
    fig.tight_layout()
    out = run_dir / "foodpo_beta_margin.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_memory(
    run_dir: Path, samples: list[tuple[float, int]], measured: dict, predicted_gb: float | None, budget_gb: float | None
) -> Path | None:
    """Memory over the run, above the framework's baseline, with the prediction and the budget."""
    if not samples:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    baseline = measured["baseline_gb"]
    fig, axis = plt.subplots(figsize=(7, 4))
    axis.plot(
        [t for t, _ in samples], [b / 1024**3 - baseline for _, b in samples], label=f"measured ({measured['device']})"
    )
    axis.axhline(
        measured["training_gb"],
        color="tab:blue",
        linestyle=":",
        label=f"measured peak {measured['training_gb']:.2f} GB",
    )
    if predicted_gb:
        axis.axhline(predicted_gb, color="tab:orange", linestyle="--", label=f"predicted {predicted_gb:.2f} GB")
    if budget_gb:
        axis.axhline(budget_gb, color="tab:red", label=f"budget {budget_gb:.2f} GB")
    axis.set_xlabel("seconds")
    axis.set_ylabel("GB above the imported framework")
    axis.set_title(f"memory: {Path(run_dir).name}")
    axis.legend(loc="lower right")
    fig.tight_layout()
    out = Path(run_dir) / "memory.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
