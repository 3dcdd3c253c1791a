"""Stage 5, evaluate: greedy accuracy, unbiased pass@k, maj@k and reward means on the held-out split.

Generation is batched (left padding); chat prompts are rendered with the model's chat template first, as GRPO
renders them (tasks/chat.py), and their items keep the rendered text (`prompt_text`). A completion counts as
correct when the configured correctness reward gives it 1.0, the same function GRPO trains on, so training and
evaluation cannot disagree about what "correct" means.
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
from grpo_pipeline.rewards.registry import completion_text
from grpo_pipeline.tasks.chat import as_completion, as_prompt, render_prompt
from grpo_pipeline.tasks.common import Checkpoint, Ref, atomic_dir, logger
from grpo_pipeline.tasks.data import read_table
from grpo_pipeline.tasks.metrics import bootstrap_ci, majority_correct, mean_pass_at_k, pass_at_k
from grpo_pipeline.tasks.stage import RunContext, stage, user_code
from grpo_pipeline.tasks.training import load_tokenizer

ITEMS_FILE = "items.jsonl"
# Rewards whose answers are not values to vote on: no maj@k for code.
NO_VOTE_REWARDS = ("code_tests",)


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
        }

    def local_files(self) -> list[str]:
        """The files these scores live in (checked before a cached result is used)."""
        return [self.items_path]

    def items(self) -> pd.DataFrame:
        """One row per eval item: id, prompt, answer, greedy, greedy_correct, samples, correct_count, the item's
        pass@k and maj@k, and its mean reward per function."""
        return pd.read_json(self.items_path, lines=True, dtype=False)


def item_id(prompt: Any) -> str:
    """A stable id for an eval item: the same prompt has the same id in every eval set (paired comparisons)."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def generate(
    model,
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    batch_size: int,
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    desc: str = "generate",
) -> list[list[str]]:
    """Completions for each prompt: greedy when `n` is 1, else `n` samples. Batched over prompts (left padding).
    A chat prompt is rendered with the tokenizer's chat template first (`render_prompt`)."""
    import torch

    sample = n > 1
    per_batch = max(1, batch_size // n)
    starts = range(0, len(prompts), per_batch)
    out: list[list[str]] = []
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
                eos_token_id=tokenizer.eos_token_id,
            )
        texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        out.extend(texts[i * n : (i + 1) * n] for i in range(len(batch)))
    return out


def reward_columns(rows: pd.DataFrame, n: int) -> tuple[list[Any], dict[str, list[Any]]]:
    """The prompts (a chat prompt as its messages, as GRPOTrainer passes it) and the reward columns of `rows`, each
    repeated `n` times (one entry per completion); the SFT target column `completion` is not passed on."""
    columns = {
        col: [v for v in rows[col].tolist() for _ in range(n)]
        for col in rows.columns
        if col not in ("prompt", "completion")
    }
    return [as_prompt(p) for p in rows["prompt"].tolist() for _ in range(n)], columns


def reward_scores(reward, rows: pd.DataFrame, completions: list[list[str]]) -> list[list[float | None]]:
    """The reward of every completion of every row, in one reward call (a chat row's completions as assistant
    messages, as GRPOTrainer passes them)."""
    n = len(completions[0])
    prompts, columns = reward_columns(rows, n)
    flat = [as_completion(p, c) for p, c in zip(prompts, [c for group in completions for c in group], strict=True)]
    scores = reward(prompts=prompts, completions=flat, **columns)
    return [list(scores[i * n : (i + 1) * n]) for i in range(len(rows))]


def score_completions(reward, rows: pd.DataFrame, completions: list[list[str]]) -> list[list[bool]]:
    """Correct (reward >= 1.0) or not for every completion of every row, in one reward call."""
    return [[s is not None and s >= 1.0 for s in group] for group in reward_scores(reward, rows, completions)]


def score_items(
    rows: pd.DataFrame,
    greedy: list[str],
    sampled: list[list[str]],
    cfg: EvalConfig,
    rewards: Sequence[RewardSpec] = (),
    prompt_texts: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Every item's scores from its greedy completion and its n samples (see `EvalResult.items`); with
    `prompt_texts` (the rendered chat prompts), each item keeps the text the model read as `prompt_text`."""
    correctness = build_reward(cfg.correctness_reward)
    greedy_ok = [g[0] for g in score_completions(correctness, rows, [[g] for g in greedy])]
    sampled_ok = score_completions(correctness, rows, sampled)
    vote = cfg.correctness_reward not in NO_VOTE_REWARDS
    per_reward = {spec.name: reward_scores(build_reward(spec.name, spec.params), rows, sampled) for spec in rewards}
    items = []
    for i, (prompt, answer) in enumerate(zip(rows["prompt"], rows.get("answer", [""] * len(rows)), strict=True)):
        keys = [answer_key(completion_text(c)) for c in sampled[i]] if vote else []
        n, c = len(sampled_ok[i]), sum(sampled_ok[i])
        items.append(
            {
                "id": item_id(prompt),
                "prompt": prompt,
                **({"prompt_text": prompt_texts[i]} if prompt_texts is not None else {}),
                "answer": answer,
                "greedy": greedy[i],
                "greedy_correct": int(greedy_ok[i]),
                "samples": sampled[i],
                "sample_correct": [int(x) for x in sampled_ok[i]],
                "correct_count": c,
                "pass_at_k": {str(k): pass_at_k(n, c, k) for k in cfg.k},
                "maj_at_k": {str(k): int(majority_correct(keys, sampled_ok[i], k)) for k in cfg.k} if vote else {},
                "sample_rewards": {name: scores[i] for name, scores in per_reward.items()},
                "reward_means": {name: _mean(scores[i]) for name, scores in per_reward.items()},
            }
        )
    return items


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
    """The scores over all items, with the settings they depend on."""
    greedy = [it["greedy_correct"] for it in items]
    names = list(items[0]["reward_means"]) if items else []
    reward_means = {}
    for name in names:
        known = [it["reward_means"][name] for it in items if it["reward_means"][name] is not None]
        if known:
            reward_means[name] = sum(known) / len(known)
    return EvalResult(
        model=model,
        accuracy=sum(greedy) / len(greedy),
        accuracy_ci=bootstrap_ci(greedy, seed=seed),
        pass_at_k={str(k): mean_pass_at_k([it["correct_count"] for it in items], cfg.n_samples, k) for k in cfg.k},
        maj_at_k={str(k): sum(it["maj_at_k"][str(k)] for it in items) / len(items) for k in cfg.k}
        if items[0]["maj_at_k"]
        else {},
        reward_means=reward_means,
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
    `out/items.jsonl` atomically and return the scores."""
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
    greedy = generate(model, tokenizer, texts, **settings, desc=f"eval {label} greedy")
    sampled = generate(
        model, tokenizer, texts, **settings, n=cfg.n_samples, temperature=cfg.temperature, top_p=cfg.top_p,
        desc=f"eval {label} pass@k",
    )  # fmt: skip
    chat = texts != prompts
    items = score_items(rows, [g[0] for g in greedy], sampled, cfg, rewards, prompt_texts=texts if chat else None)
    with atomic_dir(out) as tmp, open(tmp / ITEMS_FILE, "w") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
    result = summarize(items, cfg, model_path, seed, held_out, out / ITEMS_FILE, rewards)
    logger.info(
        "eval %s: accuracy %.3f [%.3f, %.3f], %s on %d problems",
        label,
        result.accuracy,
        *result.accuracy_ci,
        ", ".join(f"{name} {v:.3f}" for name, v in result.metrics().items() if name != "accuracy"),
        result.num_problems,
    )
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
