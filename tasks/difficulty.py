"""Stage between GRPO rounds, filter_by_difficulty: keep the training prompts the policy sometimes, not always, solves.

GRPO's advantage is a completion's reward relative to its group (DeepSeekMath sec. 4.1). A prompt that the policy
always solves, or never does, gives a group with one reward: zero advantage, no gradient, only a smaller effective
batch (and with Adam, steps that follow stale momentum). DAPO (Yu et al. 2025, "DAPO: an open-source LLM
reinforcement learning system at scale", sec. 3.2, dynamic sampling) over-samples each batch and drops the groups
whose accuracy is 0 or 1. This stage does the same at the dataset level, once per round: it samples
`samples_per_prompt` completions per training prompt from the policy that starts the round, at the rollout
temperature, scores them with the correctness reward evaluation uses, and writes the prompts whose pass rate lies
strictly between the configured bounds as the round's training split.

The stage is keyed by the policy fingerprint and the training data (tasks/core/stage.py), so it reruns exactly when the
round's starting policy or the data change. Sampling and scoring reuse evaluation's batched `generate` and
`judge`, so "correct" means the same here as in training and evaluation.

When fewer prompts pass than a GRPO step takes, the result says so (`DifficultyResult.too_few`): the policy has
nothing left to learn on these prompts, and the flow ends the rounds there, or fails the run with
`DifficultyFilterError` where the recipe asks for that (`grpo.difficulty_filter.on_too_few`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, computed_field

from grpo_pipeline.configs.schema import DifficultyFilterConfig
from grpo_pipeline.tasks.core.common import Checkpoint, Ref, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import RunContext, stage
from grpo_pipeline.tasks.core.tracking import mlflow_run
from grpo_pipeline.tasks.scoring.rollouts import Rollouts, rollouts_code, sample_judged

TRAIN_FILE = "train.parquet"
PASS_RATES_FILE = "pass_rates.jsonl"


class DifficultyFilterError(ValueError):
    """Too few prompts pass the filter to train a round on; the message says which setting to change."""


class DifficultyResult(BaseModel):
    """The round's filtered training split and how it was chosen."""

    label: str
    train: Ref
    source_fingerprint: str
    scored: int
    kept: int
    too_hard: int  # pass rate at or below min_pass_rate
    too_easy: int  # pass rate at or above max_pass_rate
    mean_pass_rate: float
    samples_per_prompt: int
    min_pass_rate: float
    max_pass_rate: float
    pass_rates_path: str
    run_id: str | None = None
    # Why a round cannot train on the kept prompts (fewer than a GRPO step takes), with the settings that would keep
    # more; empty when enough were kept.
    too_few: str = ""

    @computed_field
    @property
    def kept_fraction(self) -> float:
        """Kept prompts over scored prompts (0 when none was scored)."""
        return self.kept / self.scored if self.scored else 0.0

    def local_files(self) -> list[str]:
        return [self.pass_rates_path]

    def describe(self) -> str:
        return (
            f"kept {self.kept} of {self.scored} prompts ({100 * self.kept_fraction:.1f}%) with "
            f"{self.min_pass_rate:g} < pass rate < {self.max_pass_rate:g} over {self.samples_per_prompt} samples; "
            f"{self.too_easy} too easy, {self.too_hard} too hard, mean pass rate {self.mean_pass_rate:.3f}"
        )


def keep_mask(pass_rates: Sequence[float], min_pass_rate: float, max_pass_rate: float) -> list[bool]:
    """Which prompts to keep: pass rate strictly between the bounds (DAPO's 0 < accuracy < 1 with the defaults)."""
    return [min_pass_rate < p < max_pass_rate for p in pass_rates]


def filters_round(cfg: DifficultyFilterConfig, round_index: int) -> bool:
    """Whether round `round_index` (1-based) trains on a filtered split."""
    return cfg.enabled and (round_index >= 2 or cfg.before_first_round)


def pass_rates(
    policy: Checkpoint, rows: pd.DataFrame, n: int, rollouts: Rollouts, seed: int, label: str
) -> list[tuple[int, int]]:
    """For each row, (correct, scored) over `n` samples from `policy`: a completion the correctness reward could not
    score (None) is left out rather than counted wrong. With tools each sample is an episode, as the round's rollouts
    are, so the pass rate is the one its groups will see."""
    _, judged = sample_judged(policy, rows, n, rollouts, seed, f"difficulty {label}")
    return [(sum(ok is True for ok in group), sum(ok is not None for ok in group)) for group in judged]


@stage("difficulty-{label}", external=rollouts_code)
def filter_by_difficulty(
    policy: Checkpoint,
    train: Ref,
    cfg: DifficultyFilterConfig,
    rollouts: Rollouts,
    ctx: RunContext,
    label: str,
    min_kept: int = 1,
    *,
    out: Path,
) -> DifficultyResult:
    """The rows of `train` whose pass rate under `policy` is strictly between the bounds, written to
    `out/train.parquet` (with every scored prompt's pass rate in `out/pass_rates.jsonl`).

    When fewer than `min_kept` prompts are kept (a GRPO step needs `grpo.prompts_per_step` distinct prompts), the
    result's `too_few` says so and names the settings that would keep more; no round is to train on it
    (`check_enough`).
    """
    rows = pd.read_parquet(train.require())
    if cfg.max_prompts is not None and len(rows) > cfg.max_prompts:
        rows = rows.sample(n=cfg.max_prompts, random_state=ctx.seed).sort_index()
    rows = rows.reset_index(drop=True)
    n = cfg.samples_per_prompt
    counts = pass_rates(policy, rows, n, rollouts, ctx.seed, label)
    unscored = sum(s == 0 for _, s in counts)
    if unscored:  # no pass rate to judge them by: left out, and said so
        logger.warning("difficulty filter %s: %d prompts had no scored sample; left out", label, unscored)
    within = keep_mask([c / s if s else 0.0 for c, s in counts], cfg.min_pass_rate, cfg.max_pass_rate)
    keep = [bool(s) and k for (_, s), k in zip(counts, within, strict=True)]
    rates = [c / s for c, s in counts if s]
    kept, scored = sum(keep), len(rates)
    too_hard = sum(r <= cfg.min_pass_rate for r in rates)
    too_easy = sum(r >= cfg.max_pass_rate for r in rates)
    too_few = _too_few(cfg, label, policy, kept, scored, too_hard, too_easy, min_kept) if kept < min_kept else ""
    with atomic_dir(out) as tmp:
        rows[keep].reset_index(drop=True).to_parquet(tmp / TRAIN_FILE, index=False)
        with open(tmp / PASS_RATES_FILE, "w") as f:
            for prompt, (c, s), k in zip(rows["prompt"], counts, keep, strict=True):
                f.write(json.dumps({"prompt": prompt, "correct": c, "scored": s, "samples": n, "kept": k}) + "\n")
    result = DifficultyResult(
        label=label,
        train=Ref(path=str(out / TRAIN_FILE), fingerprint=fingerprint_path(out / TRAIN_FILE)),
        source_fingerprint=train.fingerprint,
        scored=scored,
        kept=kept,
        too_hard=too_hard,
        too_easy=too_easy,
        mean_pass_rate=sum(rates) / max(scored, 1),
        samples_per_prompt=n,
        min_pass_rate=cfg.min_pass_rate,
        max_pass_rate=cfg.max_pass_rate,
        pass_rates_path=str(out / PASS_RATES_FILE),
        too_few=too_few,
    )
    result = result.model_copy(update={"run_id": _track(result, policy, cfg, rollouts, ctx)})
    logger.info("difficulty filter before GRPO %s: %s", label, result.describe())
    if too_few:
        logger.warning("%s", too_few)
    return result


def check_enough(result: DifficultyResult, cfg: DifficultyFilterConfig) -> str:
    """Empty when a round can train on `result`'s prompts; else why not, in words that end the rounds, or
    `DifficultyFilterError` with `cfg.on_too_few: fail`."""
    if not result.too_few:
        return ""
    if cfg.on_too_few == "fail":
        raise DifficultyFilterError(result.too_few)
    return (
        f"the difficulty filter before {result.label} kept {result.kept} of {result.scored} prompts, fewer than a GRPO "
        f"step takes ({result.too_easy} at or above max_pass_rate={result.max_pass_rate:g}, {result.too_hard} at or "
        f"below min_pass_rate={result.min_pass_rate:g}): nothing left to learn on them, so the rounds end "
        "(grpo.difficulty_filter.on_too_few=fail would fail the run instead)"
    )


def _track(
    result: DifficultyResult, policy: Checkpoint, cfg: DifficultyFilterConfig, rollouts: Rollouts, ctx: RunContext
) -> str:
    """A small MLflow run per filter: its settings, the kept fraction and the pass-rate counts."""
    import mlflow

    tags = {"stage": "difficulty", "round": result.label, "parent_model": policy.lineage,
            "data_fingerprint": result.source_fingerprint}  # fmt: skip
    with mlflow_run(ctx.run_dir, ctx.experiment, f"{ctx.recipe}-difficulty-{result.label}", tags) as run:
        mlflow.log_params(
            {
                **cfg.model_dump(exclude={"enabled", "before_first_round"}),
                **rollouts.sampling.model_dump(),
                **rollouts.model_dump(exclude={"sampling"}),
                "seed": ctx.seed,
            }
        )
        mlflow.log_metrics(
            {
                "difficulty/kept_fraction": result.kept_fraction,
                "difficulty/kept": result.kept,
                "difficulty/scored": result.scored,
                "difficulty/too_easy": result.too_easy,
                "difficulty/too_hard": result.too_hard,
                "difficulty/mean_pass_rate": result.mean_pass_rate,
            }
        )
        mlflow.log_artifact(result.pass_rates_path)
    return run.info.run_id


def _too_few(
    cfg: DifficultyFilterConfig,
    label: str,
    policy: Checkpoint,
    kept: int,
    scored: int,
    too_hard: int,
    too_easy: int,
    min_kept: int,
) -> str:
    head = (
        f"difficulty filter before GRPO {label}: {kept} of {scored} training prompts have a pass rate strictly "
        f"between min_pass_rate={cfg.min_pass_rate:g} and max_pass_rate={cfg.max_pass_rate:g} under {policy.path} "
        f"({too_easy} at or above the upper bound, {too_hard} at or below the lower one, "
        f"{cfg.samples_per_prompt} samples each); a round needs at least {min_kept} (grpo.prompts_per_step). "
    )
    widen = []
    if cfg.max_pass_rate < 1 and too_easy:
        widen.append("raise grpo.difficulty_filter.max_pass_rate (up to 1)")
    if cfg.min_pass_rate > 0 and too_hard:
        widen.append("lower grpo.difficulty_filter.min_pass_rate (down to 0)")
    fixes = [
        *widen,
        "raise grpo.difficulty_filter.samples_per_prompt (more samples find rarer successes and failures)",
        *(["raise or unset grpo.difficulty_filter.max_prompts"] if cfg.max_prompts is not None else []),
        "or turn the filter off (grpo.difficulty_filter.enabled=false)",
    ]
    return head + "; ".join(fixes[:-1]) + "; " + fixes[-1]
