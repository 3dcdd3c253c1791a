"""Eval metric names: the one grammar that the config check, the gate, the guards, the summary and the rehearsal read
them by.

An evaluation scores each policy on every suite (configs/eval.py) with

  - `accuracy`: greedy correct;
  - `pass_at_<k>` for each k of the suite's `k` (the unbiased estimator over its n samples);
  - `maj_at_<k>` for the same k, where the suite's correctness reward has a final answer to vote on (not for
    `code_tests`: a program has none);
  - `reward/<name>` for each training reward (grpo.rewards), the mean over the samples: on held-out suites only
    (`source: heldout`), since another benchmark's rows need not have the columns a training reward reads
    (flows/rounds.py, `evaluate_suites`).

A name may be given as `<suite>/<metric>` (`gsm8k_test/pass_at_4`); a bare name is of the first suite. No suite may
be named `reward` (configs/eval.py), so `reward/<name>` is never read as a suite's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from grpo_pipeline.configs.eval import HELDOUT, EvalConfig

MetricKind = Literal["accuracy", "pass_at", "maj_at", "reward"]
REWARD_PREFIX = "reward/"
GRAMMAR = "accuracy, pass_at_<k>, maj_at_<k> or reward/<name>"
_AT_K = re.compile(r"(pass|maj)_at_([1-9][0-9]*)")  # k as the items store it: str(int), no leading zero


@dataclass(frozen=True)
class Metric:
    """One per-item eval metric: its kind, the k of pass@k / maj@k, the name of a reward's mean."""

    kind: MetricKind
    k: int | None = None
    reward: str | None = None

    @classmethod
    def read(cls, name: str) -> Metric | None:
        """The metric `name` spells (`pass_at_4`, `reward/format`), or None for a name outside the grammar (a
        tool-use statistic such as `tools/call_frequency`, which has no per-item scores)."""
        if name == "accuracy":
            return cls("accuracy")
        if found := _AT_K.fullmatch(name):
            return cls("pass_at" if found[1] == "pass" else "maj_at", k=int(found[2]))
        if name.startswith(REWARD_PREFIX) and len(name) > len(REWARD_PREFIX):
            return cls("reward", reward=name.removeprefix(REWARD_PREFIX))
        return None

    @classmethod
    def parse(cls, name: str) -> Metric:
        """`read`, raising ValueError that names the grammar for a name outside it."""
        metric = cls.read(name)
        if metric is None:
            raise ValueError(f"{name!r} is not an eval metric name ({GRAMMAR}, k a whole number >= 1)")
        return metric

    @property
    def name(self) -> str:
        if self.kind == "reward":
            return f"{REWARD_PREFIX}{self.reward}"
        return self.kind if self.k is None else f"{self.kind}_{self.k}"

    @property
    def by_correctness(self) -> bool:
        """Whether the correctness reward decides it (accuracy, pass@k, maj@k), not a training reward's mean."""
        return self.kind != "reward"

    def __str__(self) -> str:
        return self.name


def split_metric(name: str, suites: Sequence[str]) -> tuple[str, Metric]:
    """(suite, metric) of a gating or guarded metric: `gsm8k_test/accuracy` -> ("gsm8k_test", accuracy); a bare
    name (`accuracy`, `reward/format`) is of the first of `suites`. Raises ValueError for a suite that is not one
    of `suites` or a metric outside the grammar."""
    suite, bare = _locate(name, suites)
    return suite, Metric.parse(bare)


def _locate(name: str, suites: Sequence[str]) -> tuple[str, str]:
    """(suite, the metric's own name) of `name`; ValueError when it names a suite that is not one of `suites`."""
    head, sep, rest = name.partition("/")
    if not sep or head == REWARD_PREFIX.rstrip("/"):
        return suites[0], name
    if head not in suites:
        raise ValueError(
            f"{name!r} names no eval suite {head!r}; the suites are {list(suites)} (write <suite>/<metric>, e.g. "
            f"{suites[-1]}/accuracy)"
        )
    return head, rest


def suite_metrics(eval_cfg: EvalConfig, suite: str, rewards: Sequence[str]) -> list[Metric]:
    """The per-item metrics an evaluation of `suite` produces (the module's docstring), `rewards` being the training
    rewards' names (grpo.rewards)."""
    scored = eval_cfg.for_suite(suite)
    metrics = [Metric("accuracy"), *(Metric("pass_at", k=k) for k in scored.k)]
    if scored.votes:
        metrics += [Metric("maj_at", k=k) for k in scored.k]
    if eval_cfg.suite(suite).source == HELDOUT:
        metrics += [Metric("reward", reward=name) for name in rewards]
    return metrics


def unknown_metric(name: str, suites: Sequence[str], eval_cfg: EvalConfig, rewards: Sequence[str]) -> str:
    """Why `name` (a gating or guarded metric) is not one the evaluation produces, or "" when it is: the name as
    given, what is wrong with it and the names that are valid."""
    try:
        suite, bare = _locate(name, suites)
    except ValueError as e:
        return str(e)
    metric, offered = Metric.read(bare), suite_metrics(eval_cfg, suite, rewards)
    if metric in offered:
        return ""
    prefix = "" if suite == suites[0] else f"{suite}/"
    valid = ", ".join(f"{prefix}{m}" for m in offered)
    if metric is None:
        return f"{name!r} is not an eval metric name ({GRAMMAR}); valid names: {valid}"
    why = _why(metric, suite, eval_cfg, rewards)
    return f"{name!r} is not a metric that eval suite {suite!r} produces: {why}; valid names: {valid}"


def _why(metric: Metric, suite: str, eval_cfg: EvalConfig, rewards: Sequence[str]) -> str:
    scored = eval_cfg.for_suite(suite)
    if metric.kind in ("pass_at", "maj_at") and metric.k not in scored.k:
        where = f"the suite's k {scored.k}" if eval_cfg.suite(suite).k else f"eval.k {scored.k}"
        return f"{metric.k} is not in {where}; add it there (with n_samples >= {metric.k}) or choose another k"
    if metric.kind == "maj_at":
        return (
            f"its correctness reward {scored.correctness_reward.name!r} has no final answer to vote on, so it has no "
            "maj@k"
        )
    if metric.kind == "reward" and metric.reward in rewards:
        return (
            "training rewards are scored on held-out suites only (source: heldout): another benchmark's rows need not "
            "have the columns they read, so it would never have a score to compare"
        )
    return f"{metric.reward!r} is not one of grpo.rewards {list(rewards)}"
