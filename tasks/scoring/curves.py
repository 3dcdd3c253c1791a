"""The GRPO learning-curve plot: sampled reward and accuracy, and the held-out probe (tasks/training/probe.py) per step.

Drawn from the GRPO run's MLflow metrics after training and logged to the same run as `plots/learning_curve.png`.
matplotlib loads only when a figure is drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PROBE_METRIC = "probe/greedy_accuracy"
CURVE_ARTIFACT = "plots/learning_curve.png"


def learning_curve_figure(
    history: dict[str, list[tuple[int, float]]],
    sft_accuracy: float | None,
    final_accuracy: float | None = None,
    title: str = "GRPO learning curve",
) -> Figure:
    """Mean sampled reward, sampled accuracy and the held-out greedy-accuracy probe per step, with the SFT
    checkpoint's held-out greedy accuracy as a baseline line. `history` maps metric name -> [(step, value)]."""
    import matplotlib

    matplotlib.use("Agg")  # no display on workers and CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    styles = {
        "reward": ("mean sampled reward (weighted sum)", "tab:blue", "-"),
        "rewards/correctness/mean": ("sampled accuracy (training prompts)", "tab:orange", "-"),
        PROBE_METRIC: ("greedy accuracy, held-out probe", "tab:green", "o-"),
    }
    for key, (label, color, style) in styles.items():
        points = sorted(history.get(key, []))
        if points:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, style, color=color, label=label, markersize=3, linewidth=1.4)
    if sft_accuracy is not None:
        ax.axhline(
            sft_accuracy, color="gray", linestyle="--", linewidth=1, label=f"SFT greedy accuracy ({sft_accuracy:.3f})"
        )
    if final_accuracy is not None:
        last = max((s for pts in history.values() for s, _ in pts), default=0)
        ax.plot(
            [last],
            [final_accuracy],
            "*",
            color="tab:red",
            markersize=11,
            label=f"GRPO greedy accuracy ({final_accuracy:.3f})",
        )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward / accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def metric_history(client: Any, run_id: str, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    """[(step, value)] per metric key of an MLflow run (missing keys give empty lists)."""
    return {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys}


ROUNDS_ARTIFACT = "plots/rounds.png"


def rounds_figure(
    series: dict[str, list[tuple[str, float]]], metric: str, title: str = "What each stage added"
) -> Figure:
    """`metric` of each model in order (the SFT checkpoint, then each GRPO round), one line per series (a run, or a
    seed): where people would rather look than read the rounds table. `series` maps a name -> [(model, value)]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(model for points in series.values() for model, _ in points))
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(models) + 2), 4.2), dpi=110)
    for name, points in series.items():
        xs = [models.index(model) for model, _ in points]
        ax.plot(xs, [value for _, value in points], "o-", label=name, markersize=4, linewidth=1.4)
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


MATRIX_ARTIFACT = "plots/stages.png"


def matrix_figure(rows: list[tuple[str, dict[str, float | None]]], metric: str) -> Figure:
    """A staged run's stage x suite matrix as a heatmap: one row per stage's policy (the start first), one column per
    suite, each cell `metric` with its value written in it (blank where the suite does not score it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    suites = list(rows[0][1])
    grid = np.array([[np.nan if v.get(s) is None else v[s] for s in suites] for _, v in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(suites) + 2.5), 0.55 * len(rows) + 1.6), dpi=110)
    low, high = min(0.0, np.nanmin(grid, initial=0.0)), max(1.0, np.nanmax(grid, initial=1.0))  # a reward's own range
    image = ax.imshow(grid, cmap="viridis", vmin=low, vmax=high, aspect="auto")
    ax.set_xticks(range(len(suites)), suites)
    ax.set_yticks(range(len(rows)), [name for name, _ in rows])
    for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
            dark = (value - low) < 0.6 * (high - low)
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="white" if dark else "black")
    ax.set_title(f"{metric} by stage and suite")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig
