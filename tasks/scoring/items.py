"""Scoring eval items: every completion judged by the correctness reward, each item's pass@k, maj@k and rewards.

A completion counts as correct when the configured correctness reward gives it 1.0, the same function GRPO trains
on, so training and evaluation cannot disagree about what "correct" means. Rewards get what TRL passes them: a chat
prompt as its messages, a chat completion as an assistant message, the tokens as `completion_ids`.

A missing score is not a wrong answer. A completion the correctness reward scores None (a sandbox that could not
start the program, a math-verify timeout, an unreachable judge) is scored once more; what is still unscored stays
None, with the first reason the reward gave (`unscored_reason`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from grpo_pipeline.configs.schema import EvalConfig, RewardSpec
from grpo_pipeline.rewards import build_reward, build_spec
from grpo_pipeline.rewards.math import answer_key
from grpo_pipeline.tasks.core.chat import as_completion, as_prompt, completion_text
from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.scoring.metrics import majority_correct, scored_pass_at_k


def item_id(prompt: Any) -> str:
    """A stable id for an eval item: the same prompt has the same id in every eval set (paired comparisons)."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reward_columns(rows: pd.DataFrame, n: int) -> tuple[list[Any], dict[str, list[Any]]]:
    """The prompts (a chat prompt as its messages, as GRPOTrainer passes it) and the reward columns of `rows`, each
    repeated `n` times (one entry per completion); the SFT target column `completion` is not passed on."""
    columns = {
        col: [v for v in rows[col].tolist() for _ in range(n)]
        for col in rows.columns
        if col not in ("prompt", "completion")
    }
    return [as_prompt(p) for p in rows["prompt"].tolist() for _ in range(n)], columns


def _call(
    reward, rows: pd.DataFrame, completions: list[list[str]], ids: list[list[list[int]]] | None
) -> tuple[list[float | None], list[str | None]]:
    """One reward call over every completion of every row (flat, row-major), and why each None is None where the
    reward says (`none_reasons`, one entry per completion, as code_tests keeps it; rewards_cli prints the same)."""
    n = len(completions[0])
    prompts, columns = reward_columns(rows, n)
    flat = [as_completion(p, c) for p, c in zip(prompts, [c for group in completions for c in group], strict=True)]
    if ids is not None:
        columns["completion_ids"] = [x for group in ids for x in group]
    reasons = getattr(reward, "none_reasons", None)
    if isinstance(reasons, list):
        reasons.clear()  # so that a call that leaves them alone (a time-out) shows none from an earlier call
    scores = list(reward(prompts=prompts, completions=flat, **columns))
    reasons = getattr(reward, "none_reasons", None)
    if not isinstance(reasons, list) or len(reasons) != len(scores):
        return scores, [None] * len(scores)
    return scores, [None if s is not None or r is None else str(r) for s, r in zip(scores, reasons, strict=True)]


def reward_scores(
    reward, rows: pd.DataFrame, completions: list[list[str]], ids: list[list[list[int]]] | None = None
) -> list[list[float | None]]:
    """The reward of every completion of every row, in one reward call (a chat row's completions as assistant
    messages and, with `ids`, their token ids as `completion_ids`, as GRPOTrainer passes them)."""
    n = len(completions[0])
    scores, _ = _call(reward, rows, completions, ids)
    return [scores[i * n : (i + 1) * n] for i in range(len(rows))]


def judge(
    reward, rows: pd.DataFrame, completions: list[list[str]], ids: list[list[list[int]]] | None = None
) -> tuple[list[list[bool | None]], list[list[str | None]]]:
    """Correct (reward >= 1.0), not correct, or None (unscored) for every completion of every row, and the reason for
    each None. The completions scored None are scored once more in one call (an infrastructure failure, a time-out
    or a busy judge often passes); those still None stay None."""
    n = len(completions[0])
    scores, why = _call(reward, rows, completions, ids)
    missing = [j for j, s in enumerate(scores) if s is None]
    if missing:
        logger.warning(
            "correctness reward %r scored %d of %d completions None; scoring them once more",
            getattr(reward, "__name__", reward), len(missing), len(scores),
        )  # fmt: skip
        again_rows = rows.iloc[[j // n for j in missing]].reset_index(drop=True)
        again_ids = None if ids is None else [[ids[j // n][j % n]] for j in missing]
        again, again_why = _call(reward, again_rows, [[completions[j // n][j % n]] for j in missing], again_ids)
        for j, s, w in zip(missing, again, again_why, strict=True):
            scores[j], why[j] = s, (w or why[j]) if s is None else None
    ok = [None if s is None else s >= 1.0 for s in scores]
    return [ok[i * n : (i + 1) * n] for i in range(len(rows))], [why[i * n : (i + 1) * n] for i in range(len(rows))]


def _unscored_reason(name: str, reasons: Sequence[str | None]) -> str:
    """The first reason the reward gave for a None, else a pointer to its warnings in the log."""
    given = next((r for r in reasons if r), None)
    return given or (
        f"the correctness reward {name!r} returned None without saying why; its warnings in this run's log (logger "
        "grpo_pipeline.rewards) say which calls timed out or failed"
    )


def _flag(ok: bool | None) -> int | None:
    return None if ok is None else int(ok)


def score_items(
    rows: pd.DataFrame,
    greedy: list[str],
    sampled: list[list[str]],
    cfg: EvalConfig,
    rewards: Sequence[RewardSpec] = (),
    prompt_texts: Sequence[str] | None = None,
    greedy_ids: list[list[int]] | None = None,
    sampled_ids: list[list[list[int]]] | None = None,
) -> list[dict[str, Any]]:
    """Every item's scores from its greedy completion and its n samples (see `EvalResult.items`); with
    `prompt_texts` (the rendered chat prompts), each item keeps the text the model read as `prompt_text`; with the
    completions' token ids, rewards get them as `completion_ids` (as in training)."""
    correctness = build_spec(cfg.correctness_reward)
    greedy_judged, greedy_why = judge(correctness, rows, [[g] for g in greedy], _singletons(greedy_ids))
    sampled_ok, sampled_why = judge(correctness, rows, sampled, sampled_ids)
    vote = cfg.votes
    per_reward = {
        spec.name: reward_scores(build_reward(spec.name, spec.params, spec.timeout_s), rows, sampled, sampled_ids)
        for spec in rewards
    }
    items = []
    for i, (prompt, answer) in enumerate(zip(rows["prompt"], rows.get("answer", [""] * len(rows)), strict=True)):
        keys = [answer_key(completion_text(c)) for c in sampled[i]] if vote else []
        ok, greedy_ok = sampled_ok[i], greedy_judged[i][0]
        unscored = greedy_ok is None or None in ok
        items.append(
            {
                "id": item_id(prompt),
                "prompt": prompt,
                **({"prompt_text": prompt_texts[i]} if prompt_texts is not None else {}),
                "answer": answer,
                "greedy": greedy[i],
                "greedy_correct": _flag(greedy_ok),
                "samples": sampled[i],
                "sample_correct": [_flag(x) for x in ok],
                "correct_count": sum(x is True for x in ok),
                "scored_count": sum(x is not None for x in ok),
                "pass_at_k": {str(k): scored_pass_at_k(ok, k) for k in cfg.k},
                "maj_at_k": {str(k): _flag(majority_correct(keys, ok, k)) for k in cfg.k} if vote else {},
                "sample_rewards": {name: scores[i] for name, scores in per_reward.items()},
                "reward_means": {name: _mean(scores[i]) for name, scores in per_reward.items()},
                "unscored_reason": _unscored_reason(cfg.correctness_reward.name, [*greedy_why[i], *sampled_why[i]])
                if unscored
                else None,
            }
        )
    return items


def _singletons(ids: list[list[int]] | None) -> list[list[list[int]]] | None:
    return None if ids is None else [[x] for x in ids]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
