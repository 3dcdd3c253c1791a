"""Stage 5, evaluate: greedy accuracy, unbiased pass@k, maj@k and reward means on the held-out split.

Generation is batched (left padding); chat prompts are rendered with the model's chat template first, as GRPO
renders them (tasks/scoring/chat.py), and their items keep the rendered text (`prompt_text`). A completion counts as
correct when the configured correctness reward gives it 1.0, the same function GRPO trains on, so training and
evaluation cannot disagree about what "correct" means. Rewards get what TRL passes them, `completion_ids` included
(the generated tokens up to and including the first EOS), so a length measured in tokens is the same here as in
training.

A missing score is not a wrong answer. A completion the correctness reward scores None (a sandbox that could not
start the program, a math-verify timeout, an unreachable judge) is scored once more; what is still unscored is left
out of accuracy, pass@k and maj@k, each of which says over how many items it was computed (`EvalResult.unscored`).
When more than `eval.max_unscored_fraction` of the completions stay unscored the evaluation stops (UnscoredError)
with the first reason the reward gave, before anything is registered.
Every item's scores are kept (`items.jsonl`): the promotion gate compares two models item by item
(tasks/register.py), and `grpo-pipeline eval` reuses `evaluate_model` outside the pipeline.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel
from tqdm.auto import tqdm

from grpo_pipeline.configs.schema import EvalConfig, RewardSpec
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.math import answer_key
from grpo_pipeline.rewards.registry import REGISTRY, RewardError, completion_text
from grpo_pipeline.tasks.core.common import Checkpoint, Ref, atomic_dir, logger
from grpo_pipeline.tasks.core.stage import (
    RunContext,
    module_closure,
    package_modules,
    stage,
    user_code,
    user_code_fingerprint,
)
from grpo_pipeline.tasks.data import read_table
from grpo_pipeline.tasks.scoring.chat import as_completion, as_prompt, render_prompt
from grpo_pipeline.tasks.scoring.metrics import bootstrap_ci, majority_correct, scored_pass_at_k
from grpo_pipeline.tasks.training.trainer import load_tokenizer

ITEMS_FILE = "items.jsonl"
# Rewards whose answers are not values to vote on: no maj@k for code.
NO_VOTE_REWARDS = ("code_tests",)
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
            "eval_correctness_reward": self.config.correctness_reward,
            "eval_rewards": _specs_text(self.rewards),
            "eval_scorer_version": self.scorer_version,
            "eval_items_version": ITEMS_VERSION,
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
            f"correctness reward {self.config.correctness_reward!r}"
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
    """A hash of the code that scores: for a built-in reward, the source of its module and of every package module
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
        h.update(module.encode() + b"\0" + known[module].read_bytes() + b"\0")
    for lib in SCORER_LIBRARIES:
        try:
            h.update(f"{lib}=={version(lib)}".encode())
        except PackageNotFoundError:
            h.update(f"{lib} absent".encode())
    return h.hexdigest()[:16]


def item_id(prompt: Any) -> str:
    """A stable id for an eval item: the same prompt has the same id in every eval set (paired comparisons)."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end a completion, as TRL's GRPOTrainer collects them: the tokenizer's EOS first, then the
    model's generation_config.eos_token_id (an int or a list; trl/trainer/grpo_trainer.py, `eos_token_ids`)."""
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    eos = tokenizer.eos_token_id
    return ids if eos is None or eos in ids else [eos, *ids]


def completion_ids(generated: Sequence[int], stop: Sequence[int]) -> list[int]:
    """The generated tokens up to and including the first stop token: the `completion_ids` TRL passes to rewards
    (GRPOTrainer masks everything after the first EOS), so padding after it is not counted."""
    ids = list(generated)
    ends = [i for i, t in enumerate(ids) if t in stop]
    return ids[: ends[0] + 1] if ends else ids


def generate_with_ids(
    model,
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    batch_size: int,
    n: int = 1,
    temperature: float | None = None,
    top_p: float = 1.0,
    desc: str = "generate",
) -> tuple[list[list[str]], list[list[list[int]]]]:
    """`n` completions for each prompt and their token ids (`completion_ids`): greedy without a `temperature`,
    sampled with one (also for n = 1: pass@1 from one sample is what the recorded temperature says). Batched over
    prompts (left padding); a chat prompt is rendered with the tokenizer's chat template first (`render_prompt`)."""
    import torch

    sample = temperature is not None
    if n > 1 and not sample:
        raise ValueError(f"{n} completions per prompt need a sampling temperature; greedy ones would all be the same")
    stop = stop_token_ids(model, tokenizer)
    per_batch = max(1, batch_size // n)
    starts = range(0, len(prompts), per_batch)
    texts: list[list[str]] = []
    ids: list[list[list[int]]] = []
    for start in tqdm(starts, desc=desc, unit="batch", leave=False, disable=len(starts) <= 1):
        batch = [render_prompt(tokenizer, p) for p in prompts[start : start + per_batch]]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        with torch.no_grad():
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=top_p if sample else None,
                top_k=None,
                num_return_sequences=n,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=stop,
            )
        new = gen[:, enc["input_ids"].shape[1] :]
        decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
        kept = [completion_ids(row, stop) for row in new.tolist()]
        texts.extend(decoded[i * n : (i + 1) * n] for i in range(len(batch)))
        ids.extend(kept[i * n : (i + 1) * n] for i in range(len(batch)))
    return texts, ids


def generate(
    model,
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    batch_size: int,
    n: int = 1,
    temperature: float | None = None,
    top_p: float = 1.0,
    desc: str = "generate",
) -> list[list[str]]:
    """The completions of `generate_with_ids`, without their token ids."""
    texts, _ = generate_with_ids(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, n=n,
        temperature=temperature, top_p=top_p, desc=desc,
    )  # fmt: skip
    return texts


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
    correctness = build_reward(cfg.correctness_reward)
    greedy_judged, greedy_why = judge(correctness, rows, [[g] for g in greedy], _singletons(greedy_ids))
    sampled_ok, sampled_why = judge(correctness, rows, sampled, sampled_ids)
    vote = cfg.correctness_reward not in NO_VOTE_REWARDS
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
                "unscored_reason": _unscored_reason(cfg.correctness_reward, [*greedy_why[i], *sampled_why[i]])
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
        scorer_version=scorer_version([cfg.correctness_reward, *(r.name for r in rewards)]),
    )


def _known(values: Any) -> list[float]:
    return [float(v) for v in values if v is not None and v == v]  # v == v: not NaN


def _mean_or_nan(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def check_unscored(result: EvalResult, label: str = "") -> None:
    """Raise UnscoredError when more than `eval.max_unscored_fraction` of the completions stayed unscored."""
    limit, total = result.config.max_unscored_fraction, result.total_completions
    share = result.unscored_completions / total if total else 0.0
    if share <= limit:
        return
    raise UnscoredError(
        f"eval {label or result.model}: the correctness reward {result.config.correctness_reward!r} could not score "
        f"{result.unscored_completions} of {total} completions ({share:.1%}, greedy and sampled, after scoring them "
        f"once more), more than eval.max_unscored_fraction={limit:g}; first reason: {result.unscored_reason}. Fix "
        "what fails, or raise eval.max_unscored_fraction to report scores over the rest; nothing is registered "
        "from this evaluation"
    )


def evaluate_model(
    model_path: str,
    held_out: Ref,
    cfg: EvalConfig,
    *,
    seed: int,
    out: Path,
    rewards: Sequence[RewardSpec] = (),
    label: str = "",
) -> EvalResult:
    """Generate (greedy, then n samples) with the model at `model_path` on `rows`, score every item, write
    `out/items.jsonl` atomically and return the scores. Raises UnscoredError (and writes nothing) when more than
    `cfg.max_unscored_fraction` of the completions cannot be scored."""
    import torch
    from transformers import AutoModelForCausalLM

    rows = pd.read_parquet(held_out.require()) if held_out.path.endswith(".parquet") else read_table(held_out.path)
    if cfg.max_problems:
        rows = rows.head(cfg.max_problems)
    if rows.empty:
        raise ValueError(f"no eval rows to score {model_path} on")
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    prompts = rows["prompt"].tolist()
    texts = [render_prompt(tokenizer, p) for p in prompts]  # a chat prompt as the model reads it
    settings = {"max_new_tokens": cfg.max_new_tokens, "batch_size": cfg.batch_size}
    torch.manual_seed(seed)
    greedy, greedy_ids = generate_with_ids(model, tokenizer, texts, **settings, desc=f"eval {label} greedy")
    sampled, sampled_ids = generate_with_ids(
        model, tokenizer, texts, **settings, n=cfg.n_samples, temperature=cfg.temperature, top_p=cfg.top_p,
        desc=f"eval {label} pass@k",
    )  # fmt: skip
    chat = texts != prompts
    items = score_items(
        rows, [g[0] for g in greedy], sampled, cfg, rewards, prompt_texts=texts if chat else None,
        greedy_ids=[g[0] for g in greedy_ids], sampled_ids=sampled_ids,
    )  # fmt: skip
    result = summarize(items, cfg, model_path, seed, held_out, out / ITEMS_FILE, rewards)
    check_unscored(result, label)
    with atomic_dir(out) as tmp, open(tmp / ITEMS_FILE, "w") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
    logger.info(
        "eval %s: accuracy %.3f [%.3f, %.3f], %s on %d problems",
        label,
        result.accuracy,
        *result.accuracy_ci,
        ", ".join(f"{name} {v:.3f}" for name, v in result.metrics().items() if name != "accuracy"),
        result.num_problems,
    )
    if result.unscored_line():
        logger.warning("eval %s: %s", label, result.unscored_line())
    return result


def _eval_code(params: dict[str, Any]) -> dict[str, str]:
    return user_code([params["cfg"].correctness_reward, *(r.name for r in params.get("rewards") or ())])


@stage("eval-{label}", external=_eval_code)
def evaluate(
    policy: Checkpoint,
    held_out: Ref,
    cfg: EvalConfig,
    ctx: RunContext,
    label: str,
    rewards: list[RewardSpec] | None = None,
    *,
    out: Path,
) -> EvalResult:
    """Greedy accuracy, pass@k, maj@k and the mean of each of `rewards` for `policy` on the held-out split;
    per-item scores go to `out`."""
    return evaluate_model(policy.path, held_out, cfg, seed=ctx.seed, out=out, rewards=rewards or (), label=label)
