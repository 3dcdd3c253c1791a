"""Stage 5, evaluate: greedy accuracy and unbiased pass@k on the held-out split.

Generation is batched (left padding). A completion counts as correct when the configured correctness reward gives
it 1.0, the same function GRPO trains on, so training and evaluation cannot disagree about what "correct" means.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from pydantic import BaseModel
from tqdm.auto import tqdm

from grpo_pipeline.configs.schema import EvalConfig
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.common import Checkpoint, Ref, atomic_dir, logger
from grpo_pipeline.tasks.metrics import mean_pass_at_k
from grpo_pipeline.tasks.stage import RunContext, stage, user_code
from grpo_pipeline.tasks.training import load_tokenizer


class EvalResult(BaseModel):
    """Scores plus everything needed to reproduce them (n, k, sampling settings)."""

    model: str
    accuracy: float
    pass_at_k: dict[str, float]
    num_problems: int
    n_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    details_path: str

    def metrics(self, prefix: str = "") -> dict[str, float]:
        out = {f"{prefix}accuracy": self.accuracy}
        out.update({f"{prefix}pass_at_{k}": v for k, v in self.pass_at_k.items()})
        return out


def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    batch_size: int,
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    desc: str = "generate",
) -> list[list[str]]:
    """Completions for each prompt: greedy when `n` is 1, else `n` samples. Batched over prompts (left padding)."""
    import torch

    sample = n > 1
    per_batch = max(1, batch_size // n)
    starts = range(0, len(prompts), per_batch)
    out: list[list[str]] = []
    for start in tqdm(starts, desc=desc, unit="batch", leave=False, disable=len(starts) <= 1):
        batch = prompts[start : start + per_batch]
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


def score_completions(reward, rows: pd.DataFrame, completions: list[list[str]]) -> list[list[bool]]:
    """Correct (reward >= 1.0) or not for every completion of every row, in one reward call.

    `rows` holds the prompts and the reward's columns; the SFT target column `completion` is not passed on.
    """
    n = len(completions[0])
    flat = [c for group in completions for c in group]
    columns = {
        col: [v for v in rows[col].tolist() for _ in range(n)]
        for col in rows.columns
        if col not in ("prompt", "completion")
    }
    prompts = [p for p in rows["prompt"].tolist() for _ in range(n)]
    scores = reward(prompts=prompts, completions=flat, **columns)
    ok = [s is not None and s >= 1.0 for s in scores]
    return [ok[i * n : (i + 1) * n] for i in range(len(rows))]


@stage("eval-{label}", external=lambda params: user_code([params["cfg"].correctness_reward]))
def evaluate(policy: Checkpoint, held_out: Ref, cfg: EvalConfig, ctx: RunContext, label: str, out: Path) -> EvalResult:
    """Greedy accuracy and pass@k of `policy` on the held-out split; per-problem details go to `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    rows = pd.read_parquet(held_out.require())
    if cfg.max_problems:
        rows = rows.head(cfg.max_problems)
    reward = build_reward(cfg.correctness_reward)
    tokenizer = load_tokenizer(policy.path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(policy.path)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    prompts = rows["prompt"].tolist()

    torch.manual_seed(ctx.seed)
    greedy = generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
        desc=f"eval {label} greedy",
    )
    sampled = generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
        n=cfg.n_samples,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        desc=f"eval {label} pass@k",
    )
    greedy_ok = [g[0] for g in score_completions(reward, rows, greedy)]
    counts = [sum(s) for s in score_completions(reward, rows, sampled)]

    with atomic_dir(out) as tmp:
        (tmp / "details.json").write_text(
            json.dumps(
                {
                    "prompts": prompts,
                    "greedy": [g[0] for g in greedy],
                    "greedy_correct": [int(x) for x in greedy_ok],
                    "sampled_correct_counts": counts,
                    "samples_first_problem": sampled[0] if sampled else [],
                }
            )
        )
    result = EvalResult(
        model=policy.path,
        accuracy=sum(greedy_ok) / len(greedy_ok),
        pass_at_k={str(k): mean_pass_at_k(counts, cfg.n_samples, k) for k in cfg.k},
        num_problems=len(rows),
        n_samples=cfg.n_samples,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        details_path=str(out / "details.json"),
    )
    logger.info(
        "eval %s: accuracy %.3f, %s on %d problems",
        label,
        result.accuracy,
        ", ".join(f"pass@{k} {v:.3f}" for k, v in result.pass_at_k.items()),
        result.num_problems,
    )
    return result
