"""An evaluation's result: the scores on a held-out split and everything needed to reproduce them (`EvalResult`).

`summarize` turns the scored items (tasks/scoring/items.py) into greedy accuracy, unbiased pass@k, maj@k and reward
means. Completions left unscored are left out of accuracy, pass@k and maj@k, each of which says over how many items
it was computed (`EvalResult.unscored`); when more than `eval.max_unscored_fraction` of a metric's items stay
unscored, `check_unscored` stops the evaluation (UnscoredError) with the first reason the reward gave, before
anything is registered. `EvalResult.settings` is what the scores depend on besides the model (the eval set, the
sampler, the scorer's code: `scorer_version`), stored with every score so that the promotion gate compares two
models' items (`ITEMS_FILE`) only where they were scored alike (tasks/release/champion.py). How a model is evaluated
is tasks/scoring/evaluation.py's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from grpo_pipeline.configs.schema import HELDOUT, EvalConfig, Metric, RewardSpec
from grpo_pipeline.rewards.registry import REGISTRY, RewardError
from grpo_pipeline.tasks.core.common import Ref
from grpo_pipeline.tasks.core.stage import (
    code_text,
    module_closure,
    package_modules,
    user_code_fingerprint,
)
from grpo_pipeline.tasks.scoring.items import _mean
from grpo_pipeline.tasks.scoring.metrics import bootstrap_ci

ITEMS_FILE = "items.jsonl"

# How an item's scores are computed (recorded with the eval settings): bump it when that changes, so the gate scores
# a champion again instead of comparing its stored items with items computed another way.
# 2: unscored completions kept apart (None), n_samples 1 sampled, rewards given completion_ids.
ITEMS_VERSION = 2

# Reward params longer than this (as JSON) are recorded by their hash: MLflow params and tags have a size limit.
MAX_SETTING_CHARS = 250

# The libraries whose version changes what a built-in reward scores.
SCORER_LIBRARIES = ("math-verify",)


class UnscoredError(RewardError):
    """The correctness reward left more of the completions unscored than `eval.max_unscored_fraction` allows:
    accuracy over the rest would speak for an eval set the model was not measured on (a reward fails on some
    completions and not others, so what is missing is not missing at random)."""


class EvalResult(BaseModel):
    """Scores plus everything needed to reproduce them (n, k, sampling settings, eval set, seed)."""

    model: str
    accuracy: float
    accuracy_ci: tuple[float, float]
    pass_at_k: dict[str, float]
    maj_at_k: dict[str, float] = {}
    reward_means: dict[str, float] = {}
    num_problems: int
    n_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    eval_fingerprint: str
    eval_path: str
    config: EvalConfig
    rewards: list[RewardSpec] = []
    items_path: str
    # Per metric of `metrics()`: the items it has no score for (left out of its mean, which is over the others).
    unscored: dict[str, int] = {}
    # Completions (greedy and sampled) the correctness reward scored None even when asked again, and the first reason.
    unscored_completions: int = 0
    unscored_reason: str = ""
    # A hash of the code of the correctness reward and of the rewards in `rewards` (see `scorer_version`).
    scorer_version: str = ""
    # The sampler as `generate` applied it (greedy and sampled) and what the checkpoint's generation_config asked for
    # that evaluation did not apply (tasks/scoring/generation.py, `recorded_settings`); empty for older results.
    generation: dict[str, Any] = {}
    # The eval suite these scores are of (configs/eval.py; `heldout`: the held-out split of the training source).
    suite: str = HELDOUT
    # A tool-using policy's episodes (agents/episodes.py, `episode_stats`): tool calls per episode, the share that
    # called, failed calls per call and the share that wrote a call past the turn limit, for the greedy and the
    # sampled episodes (`tools/greedy_call_frequency`, ...); empty without tools.
    tools: dict[str, float] = {}

    def scored(self, metric: str) -> int:
        """Over how many items `metric` was computed (its denominator)."""
        return self.num_problems - self.unscored.get(metric, 0)

    @property
    def total_completions(self) -> int:
        """The completions the correctness reward judged: one greedy and n sampled per item."""
        return self.num_problems * (1 + self.n_samples)

    def metrics(self, prefix: str = "") -> dict[str, float]:
        out = {f"{prefix}accuracy": self.accuracy}
        out.update({f"{prefix}pass_at_{k}": v for k, v in self.pass_at_k.items()})
        out.update({f"{prefix}maj_at_{k}": v for k, v in self.maj_at_k.items()})
        out.update({f"{prefix}reward/{name}": v for name, v in self.reward_means.items()})
        out.update({f"{prefix}{name}": v for name, v in self.tools.items()})
        return out

    def settings(self) -> dict[str, Any]:
        """What the scores depend on besides the model: stored with every score (MLflow params, version tags)."""
        return {
            "eval_num_problems": self.num_problems,
            "eval_n_samples": self.n_samples,
            "eval_k": ",".join(self.pass_at_k),
            "eval_temperature": self.temperature,
            "eval_top_p": self.top_p,
            "eval_max_new_tokens": self.max_new_tokens,
            "eval_seed": self.seed,
            "eval_fingerprint": self.eval_fingerprint,
            # the scorer: a champion scored by another reward, other params or other reward code is scored again
            "eval_correctness_reward": _specs_text([self.config.correctness_reward]),
            "eval_rewards": _specs_text(self.rewards),
            "eval_scorer_version": self.scorer_version,
            "eval_items_version": ITEMS_VERSION,
            # the generator: a champion sampled by transformers' generate is scored again for a challenger sampled
            # by vLLM (or in another dtype, or by another vLLM), not compared as if the protocol were one
            "eval_backend": self.generation.get("backend", ""),
            "eval_dtype": str(self.generation.get("dtype", "")),
            "eval_vllm_version": self.generation.get("vllm_version", ""),
            # the episodes: a champion scored on single completions is scored again with the tools
            "eval_tools": ",".join(self.config.tools or []),
            "eval_max_tool_turns": self.config.max_tool_turns or 0,
            "eval_environment": self.config.environment or "",
        }

    def unscored_line(self) -> str:
        """One line on what could not be scored ("" when everything was)."""
        if not self.unscored_completions and not any(self.unscored.values()):
            return ""
        per_metric = ", ".join(
            f"{m} over {self.scored(m)} of {self.num_problems}" for m, u in self.unscored.items() if u
        )
        reason = f"; first reason: {self.unscored_reason}" if self.unscored_reason else ""
        return (
            f"unscored: {self.unscored_completions} of {self.total_completions} completions left out by the "
            f"correctness reward {self.config.correctness_reward.name!r}"
            + (f"; {per_metric}" if per_metric else "")
            + reason
        )

    def local_files(self) -> list[str]:
        """The files these scores live in (checked before a cached result is used)."""
        return [self.items_path]

    def items(self) -> pd.DataFrame:
        """One row per eval item: id, prompt, answer, greedy, greedy_correct (1, 0, or None: unscored), samples,
        sample_correct (the same per sample), correct_count and scored_count (among the samples), the item's pass@k
        and maj@k (None where unscored), its rewards and mean reward per function, and unscored_reason."""
        return pd.read_json(self.items_path, lines=True, dtype=False)


def _specs_text(specs: Sequence[RewardSpec]) -> str:
    """The rewards' names and params as compact JSON, or its hash when that is too long for an MLflow param."""
    text = json.dumps([[r.name, r.params] for r in specs], sort_keys=True, separators=(",", ":"), default=str)
    if len(text) <= MAX_SETTING_CHARS:
        return text
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def scorer_version(names: Sequence[str]) -> str:
    """A hash of the code that scores: for a built-in reward, the code (`code_text`) of its module and of every module
    it imports (in practice the whole rewards/ package, which rewards/__init__ imports) and the versions of
    `SCORER_LIBRARIES`; for a dotted path, the user's module (`user_code_fingerprint`)."""
    from importlib.metadata import PackageNotFoundError, version

    known = package_modules()
    modules: set[str] = set()
    h = hashlib.sha256()
    for name in sorted(set(names)):
        if name in REGISTRY:
            modules |= module_closure(REGISTRY[name].__module__)
        else:
            h.update(name.encode() + b"\0" + user_code_fingerprint(name).encode() + b"\0")
    for module in sorted(modules):
        h.update(module.encode() + b"\0" + code_text(known[module]).encode() + b"\0")
    for lib in SCORER_LIBRARIES:
        try:
            h.update(f"{lib}=={version(lib)}".encode())
        except PackageNotFoundError:
            h.update(f"{lib} absent".encode())
    return h.hexdigest()[:16]


def summarize(
    items: list[dict[str, Any]],
    cfg: EvalConfig,
    model: str,
    seed: int,
    held_out: Ref,
    path: Path,
    rewards: Sequence[RewardSpec] = (),
) -> EvalResult:
    """The scores over all items, with the settings they depend on. Each metric is the mean over the items that
    have a score for it; `unscored` counts the others."""
    per_metric: dict[str, list[float]] = {"accuracy": _known(it.get("greedy_correct") for it in items)}
    for k in map(str, cfg.k):
        per_metric[f"pass_at_{k}"] = _known(it["pass_at_k"].get(k) for it in items)
    if items and items[0]["maj_at_k"]:
        for k in map(str, cfg.k):
            per_metric[f"maj_at_{k}"] = _known(it["maj_at_k"].get(k) for it in items)
    for name in items[0]["reward_means"] if items else []:
        per_metric[f"reward/{name}"] = _known(it["reward_means"].get(name) for it in items)
    accuracy = per_metric["accuracy"]
    unscored_completions = sum(
        (it.get("greedy_correct") is None) + sum(x is None for x in it.get("sample_correct", [])) for it in items
    )
    return EvalResult(
        model=model,
        accuracy=_mean(accuracy) if accuracy else float("nan"),
        accuracy_ci=bootstrap_ci(accuracy, seed=seed) if accuracy else (float("nan"), float("nan")),
        pass_at_k={str(k): _mean_or_nan(per_metric[f"pass_at_{k}"]) for k in cfg.k},
        maj_at_k={str(k): _mean_or_nan(per_metric[f"maj_at_{k}"]) for k in cfg.k}
        if f"maj_at_{cfg.k[0]}" in per_metric
        else {},
        reward_means={
            m.removeprefix("reward/"): _mean(v) for m, v in per_metric.items() if m.startswith("reward/") and v
        },
        num_problems=len(items),
        n_samples=cfg.n_samples,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=seed,
        eval_fingerprint=held_out.fingerprint,
        eval_path=held_out.path,
        config=cfg,
        rewards=list(rewards),
        items_path=str(path),
        unscored={m: len(items) - len(v) for m, v in per_metric.items()},
        unscored_completions=unscored_completions,
        unscored_reason=next((it["unscored_reason"] for it in items if it.get("unscored_reason")), ""),
        scorer_version=scorer_version([cfg.correctness_reward.name, *(r.name for r in rewards)]),
    )


def _known(values: Any) -> list[float]:
    return [float(v) for v in values if v is not None and v == v]  # v == v: not NaN


def _mean_or_nan(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def unscored_shares(result: EvalResult) -> dict[str, tuple[int, int]]:
    """(left out, of) for each metric the correctness reward decides, over that metric's own items: greedy items
    for accuracy, problems for pass@k and maj@k, and the sampled completions they are estimated from."""
    greedy = result.unscored.get("accuracy", 0)
    shares = {
        m: (n, result.num_problems)
        for m, n in result.unscored.items()
        if (metric := Metric.read(m)) is not None and metric.by_correctness
    }
    shares["sampled completions"] = (result.unscored_completions - greedy, result.num_problems * result.n_samples)
    return shares


def check_unscored(result: EvalResult, label: str = "") -> None:
    """Raise UnscoredError when any metric has more than `eval.max_unscored_fraction` of its own items unscored
    (pooling greedy and sampled completions would let a fifth of accuracy's items go unscored under a 2% cap)."""
    limit = result.config.max_unscored_fraction
    over = {m: (n, total) for m, (n, total) in unscored_shares(result).items() if total and n / total > limit}
    if not over:
        return
    listed = "; ".join(f"{m}: {n} of {total} ({n / total:.1%})" for m, (n, total) in over.items())
    raise UnscoredError(
        f"eval {label or result.model}: the correctness reward {result.config.correctness_reward.name!r} left more "
        f"than eval.max_unscored_fraction={limit:g} of a metric's items unscored after scoring them once more "
        f"({listed}); first reason: {result.unscored_reason}. Fix what fails, or raise eval.max_unscored_fraction to "
        "report scores over the rest; nothing is registered from this evaluation"
    )
