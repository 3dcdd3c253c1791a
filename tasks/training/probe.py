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

from grpo_pipeline.configs.grpo import RewardSpec
from grpo_pipeline.rewards import build_spec
from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.scoring.curves import PROBE_METRIC
from grpo_pipeline.tasks.scoring.generation import generate
from grpo_pipeline.tasks.scoring.items import judge
from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci


def greedy_accuracy(model, tokenizer, rows: pd.DataFrame, reward, max_new_tokens: int) -> float:
    """Fraction of `rows` whose greedy completion gets `reward` >= 1.0 (one batched generate call)."""
    return accuracy(greedy_correct(model, tokenizer, rows, reward, max_new_tokens))


def accuracy(items: list[float | None]) -> float:
    """The mean of the scored items (an unscored completion is left out); NaN when none was scored."""
    scored = [c for c in items if c is not None]
    return sum(scored) / len(scored) if scored else float("nan")


def greedy_correct(model, tokenizer, rows: pd.DataFrame, reward, max_new_tokens: int) -> list[float | None]:
    """Per row: 1.0 when its greedy completion gets `reward` >= 1.0, else 0.0; None when the reward could not
    score it (left out of the accuracy)."""
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    try:
        texts = generate(model, tokenizer, rows["prompt"].tolist(), max_new_tokens=max_new_tokens, batch_size=len(rows))
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    judged, _ = judge(reward, rows, texts)
    return [group[0] for group in judged]


def beats_start(start: list[float | None], best: list[float | None]) -> tuple[bool, tuple[float, float, float]]:
    """Whether `best` is more accurate than `start` on the same probe rows beyond the noise: the lower bound of the
    paired bootstrap 95% CI of (best - start) over the rows both scored is above zero. Also (mean, low, high)."""
    pairs = [(a, b) for a, b in zip(start, best, strict=True) if a is not None and b is not None]
    if len(pairs) < 2:
        return False, (math.nan, math.nan, math.nan)
    mean, low, high = paired_bootstrap_ci([a for a, _ in pairs], [b for _, b in pairs], n_boot=2_000, seed=0)
    return low > 0, (mean, low, high)


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
        correctness: RewardSpec,
        keep_best: bool = False,
        patience: int = 0,
        notes: list[str] | None = None,
        stop_at: float | None = None,
        over_start: bool = False,
    ):
        self.rows = rows.reset_index(drop=True)
        self.tokenizer = tokenizer
        self.every_steps = every_steps
        self.max_new_tokens = max_new_tokens
        self.reward = build_spec(correctness)
        self.keep_best = keep_best
        self.stop_at = stop_at  # end training at the first probe at or above this accuracy
        self.patience = patience
        self.over_start = over_start  # with keep_best: the start stays unless the best step beats it (beats_start)
        self._start: tuple[int, list[float | None], dict[str, object]] | None = None
        self._best_items: list[float | None] = []
        self.history: list[tuple[int, float]] = []
        self.best: tuple[int, float] | None = None  # (step, accuracy) of the kept weights
        self.kept_step: int | None = None
        self.notes: list[str] = [] if notes is None else notes  # appended to: a caller may share its list
        self._weights: dict[str, object] = {}
        self._since_best = 0
        self._early_stop_at: int | None = None

    def _measure(self, step: int, model) -> float:
        import mlflow

        items = greedy_correct(model, self.tokenizer, self.rows, self.reward, self.max_new_tokens)
        acc = accuracy(items)
        self.history.append((step, acc))
        if mlflow.active_run() is not None:
            mlflow.log_metric(PROBE_METRIC, acc, step=step)
        if self.keep_best and not math.isnan(acc) and self._consider(step, acc, model):
            self._best_items = items
            if self.over_start and self._start is None:  # the first probe is always kept: its copy is the start's
                self._start = (step, items, self._weights)
        return acc

    def _consider(self, step: int, acc: float, model) -> bool:
        """Keep a copy of the trainable weights when `acc` is at least the best so far (ties: the later step)."""
        if self.best is not None and acc < self.best[1]:
            self._since_best += 1
            return False
        self._since_best = 0 if self.best is None or acc > self.best[1] else self._since_best + 1
        self.best = (step, acc)
        self._weights = trainable_copy(model)
        return True

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
        note = None
        if self._start is not None and best_step != self._start[0]:
            better, (gain, low, high) = beats_start(self._start[1], self._best_items)
            if not better:  # the round's best is not clearly better than where it started: keep the start
                note = (
                    f"kept the start (step {self._start[0]}) of {step} (grpo.keep_over_start): the best step "
                    f"{best_step}'s probe gain {gain:+.3f} (paired 95% CI {low:+.3f}..{high:+.3f}) is not above zero"
                )
                best_step, best_acc, self._weights = self._start[0], self.history[0][1], self._start[2]
        if best_step != step:
            restore(model, self._weights)
        self.kept_step = best_step
        why = "the round's best held-out probe accuracy, ties to the later step"
        self.notes.append(
            note
            or f"kept step {best_step} of {step} (grpo.keep=best_probe): probe accuracy {best_acc:.3f}, {why}; the "
            f"last step's was {last_acc:.3f}"
        )
        logger.info("%s", self.notes[-1])
        self._weights, self._start = {}, None


def trainable_copy(model) -> dict[str, object]:
    """A CPU copy of `model`'s trainable parameters, by name."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def restore(model, weights: dict[str, object]) -> None:
    """Copy `weights` (name -> tensor, as kept by the probe) back into `model`'s parameters of those names."""
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
