"""The held-out accuracy probe: greedy accuracy on the probe split (data.num_probe rows, held out from training and
disjoint from the eval items), measured during GRPO.

It measures what evaluation measures (greedy answers on unseen problems), not only the sampled training reward,
in one batched `generate` call every few steps, and logs it to the training run (MLflow `probe/greedy_accuracy`).
With `grpo.keep: best_probe` it also chooses the policy a round returns: the step with the best probe accuracy
(ties go to the later step), whose trainable weights it keeps a copy of (on the CPU) until the round ends, and it
can end a round whose probe has stopped improving (`grpo.probe_patience`). Because the probe never sees an eval
item, that choice cannot leak into the evaluation or the gate.
"""

from __future__ import annotations

import math

import pandas as pd
from transformers import TrainerCallback

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.core.common import logger
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
    """Log greedy accuracy on the probe rows when training starts, every `every_steps` steps and at its end (MLflow
    metric `probe/greedy_accuracy`); keeps the values in `history` as (step, accuracy).

    With `keep_best`, the round ends with the weights of its best-probed step (`kept_step`), and `patience` > 0 ends
    it once that many probes in a row have not beaten the best. `notes` says what was kept and why."""

    def __init__(
        self,
        rows: pd.DataFrame,
        tokenizer,
        every_steps: int,
        max_new_tokens: int,
        correctness: str,
        keep_best: bool = False,
        patience: int = 0,
        notes: list[str] | None = None,
        stop_at: float | None = None,
    ):
        self.rows = rows.reset_index(drop=True)
        self.tokenizer = tokenizer
        self.every_steps = every_steps
        self.max_new_tokens = max_new_tokens
        self.reward = build_reward(correctness)
        self.keep_best = keep_best
        self.stop_at = stop_at  # end training at the first probe at or above this accuracy
        self.patience = patience
        self.history: list[tuple[int, float]] = []
        self.best: tuple[int, float] | None = None  # (step, accuracy) of the kept weights
        self.kept_step: int | None = None
        self.notes: list[str] = [] if notes is None else notes  # appended to: a caller may share its list
        self._weights: dict[str, object] = {}
        self._since_best = 0
        self._early_stop_at: int | None = None

    def _measure(self, step: int, model) -> float:
        import mlflow

        acc = greedy_accuracy(model, self.tokenizer, self.rows, self.reward, self.max_new_tokens)
        self.history.append((step, acc))
        if mlflow.active_run() is not None:
            mlflow.log_metric(PROBE_METRIC, acc, step=step)
        if self.keep_best and not math.isnan(acc):
            self._consider(step, acc, model)
        return acc

    def _consider(self, step: int, acc: float, model) -> None:
        """Keep a copy of the trainable weights when `acc` is at least the best so far (ties: the later step)."""
        if self.best is not None and acc < self.best[1]:
            self._since_best += 1
            return
        self._since_best = 0 if self.best is None or acc > self.best[1] else self._since_best + 1
        self.best = (step, acc)
        self._weights = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._measure(state.global_step, model)  # the start policy (or where an interrupted round resumes)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        due = state.global_step % self.every_steps == 0 or state.global_step == state.max_steps
        if due and (not self.history or self.history[-1][0] != state.global_step):
            self._measure(state.global_step, model)
            if self.keep_best and self.patience and self._since_best >= self.patience:
                self._early_stop_at = state.global_step
                control.should_training_stop = True
            self._stop_at_bar(state, control)

    def _stop_at_bar(self, state, control) -> None:
        acc = self.history[-1][1]
        if self.stop_at is not None and acc >= self.stop_at and state.global_step < state.max_steps:
            control.should_training_stop = True
            self.notes.append(
                f"ended at step {state.global_step} of {state.max_steps}: the probe's greedy accuracy {acc:.3f} "
                f"reached {self.stop_at}"
            )
            logger.info("%s", self.notes[-1])

    def on_train_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if not self.history or self.history[-1][0] != step:
            self._measure(step, model)
        if not self.keep_best or self.best is None:
            return
        best_step, best_acc = self.best
        last_acc = self.history[-1][1]
        if self._early_stop_at is not None:
            self.notes.append(
                f"ended at step {self._early_stop_at} of {state.max_steps}: {self.patience} probe(s) in a row did not "
                f"beat the best (grpo.probe_patience={self.patience})"
            )
        if best_step != step:
            restore(model, self._weights)
        self.kept_step = best_step
        why = "the round's best held-out probe accuracy, ties to the later step"
        self.notes.append(
            f"kept step {best_step} of {step} (grpo.keep=best_probe): probe accuracy {best_acc:.3f}, {why}; the last "
            f"step's was {last_acc:.3f}"
        )
        logger.info("%s", self.notes[-1])
        self._weights = {}


def restore(model, weights: dict[str, object]) -> None:
    """Copy `weights` (name -> tensor, as kept by the probe) back into `model`'s parameters of those names."""
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
