"""Learning curves for GRPO: a cheap held-out accuracy probe during training, and the reward-curve plot.

The probe measures greedy accuracy on a fixed subset of the held-out split every few steps (one batched
`generate` call), so the curve shows what evaluation measures (greedy answers on unseen problems), not only the
sampled training reward. The plot is drawn from the GRPO run's MLflow metrics after training and logged to the
same run as `plots/learning_curve.png`.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display on workers and CI
import matplotlib.pyplot as plt
import pandas as pd
from transformers import TrainerCallback

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.evaluate import generate, score_completions

PROBE_METRIC = "probe/greedy_accuracy"
CURVE_ARTIFACT = "plots/learning_curve.png"


def greedy_accuracy(model, tokenizer, rows: pd.DataFrame, reward, max_new_tokens: int) -> float:
    """Fraction of `rows` whose greedy completion gets `reward` >= 1.0 (one batched generate call)."""
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        texts = generate(model, tokenizer, rows["prompt"].tolist(), max_new_tokens=max_new_tokens, batch_size=len(rows))
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    correct = score_completions(reward, rows, texts)
    return sum(ok[0] for ok in correct) / len(rows)


class HeldOutAccuracyProbe(TrainerCallback):
    """Log greedy accuracy on a fixed held-out subset at step 0 and every `every_steps` steps (MLflow metric
    `probe/greedy_accuracy`); keeps the values in `history` as (step, accuracy)."""

    def __init__(self, rows: pd.DataFrame, tokenizer, every_steps: int, max_new_tokens: int, correctness: str):
        self.rows = rows.reset_index(drop=True)
        self.tokenizer = tokenizer
        self.every_steps = every_steps
        self.max_new_tokens = max_new_tokens
        self.reward = build_reward(correctness)
        self.history: list[tuple[int, float]] = []

    def _measure(self, step: int, model) -> None:
        import mlflow

        acc = greedy_accuracy(model, self.tokenizer, self.rows, self.reward, self.max_new_tokens)
        self.history.append((step, acc))
        if mlflow.active_run() is not None:
            mlflow.log_metric(PROBE_METRIC, acc, step=step)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._measure(0, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        due = state.global_step % self.every_steps == 0 or state.global_step == state.max_steps
        if due and (not self.history or self.history[-1][0] != state.global_step):
            self._measure(state.global_step, model)


def learning_curve_figure(
    history: dict[str, list[tuple[int, float]]],
    sft_accuracy: float | None,
    final_accuracy: float | None = None,
    title: str = "GRPO learning curve",
):
    """Mean sampled reward, sampled accuracy and the held-out greedy-accuracy probe per step, with the SFT
    checkpoint's held-out greedy accuracy as a baseline line. `history` maps metric name -> [(step, value)]."""
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


def metric_history(client, run_id: str, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    """[(step, value)] per metric key of an MLflow run (missing keys give empty lists)."""
    return {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys}
