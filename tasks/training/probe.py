"""The held-out accuracy probe: greedy accuracy on a fixed subset of the held-out split, measured during GRPO.

It measures what evaluation measures (greedy answers on unseen problems), not only the sampled training reward,
in one batched `generate` call every few steps, and logs it to the training run (MLflow `probe/greedy_accuracy`).
"""

from __future__ import annotations

import pandas as pd
from transformers import TrainerCallback

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.scoring.curves import PROBE_METRIC
from grpo_pipeline.tasks.scoring.generation import generate
from grpo_pipeline.tasks.scoring.items import judge


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
    judged, _ = judge(reward, rows, texts)
    scored = [group[0] for group in judged if group[0] is not None]  # an unscored completion is left out
    return sum(scored) / len(scored) if scored else float("nan")


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
