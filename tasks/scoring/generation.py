"""Batched generation for the evaluation, the difficulty filter and the held-out accuracy probe: left padding,
greedy or n samples per prompt (each prompt run through the model once for its n, `generate_rows`), each completion
cut at the first stop token as TRL's GRPOTrainer cuts it, with its token ids (`completion_ids`, so a length measured
in tokens is the same here as in training)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from grpo_pipeline.agents.episodes import completion_ids
from grpo_pipeline.agents.episodes import prompt_ids as trl_prompt_ids
from grpo_pipeline.tasks.core.chat import as_prompt, require_chat_template

# Sampling settings evaluation always sets itself, at the values TRL's GRPOTrainer trains with (GRPOConfig's top_k 0
# and repetition_penalty 1.0): `generate` would otherwise take them from the checkpoint's generation_config (Qwen2.5
# Instruct ships repetition_penalty 1.05 and top_k 20), and the scores would come from another sampler than the
# rollouts', unrecorded.
AS_IN_TRAINING = {"top_k": None, "repetition_penalty": 1.0}
# The fields of a generation config that change which tokens are drawn (recorded with every evaluation).
SAMPLING_FIELDS = ("max_new_tokens", "do_sample", "num_beams", "temperature", "top_p", "top_k", "min_p", "typical_p",
                   "epsilon_cutoff", "eta_cutoff", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
                   "suppress_tokens", "begin_suppress_tokens")  # fmt: skip


def generation_kwargs(
    *, max_new_tokens: int, n: int, temperature: float | None, top_p: float, pad: int | None, stop: list[int]
) -> dict[str, Any]:
    """The arguments of every `generate` call here: greedy without a `temperature`, sampled with one."""
    sample = temperature is not None
    return {
        "max_new_tokens": max_new_tokens,
        "do_sample": sample,
        "temperature": temperature if sample else None,
        "top_p": top_p if sample else None,
        **AS_IN_TRAINING,
        "num_return_sequences": n,
        "pad_token_id": pad,
        "eos_token_id": stop,
    }


def applied_settings(model, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings `generate(**kwargs)` actually uses on `model`: the kwargs over the checkpoint's own
    generation_config over transformers' defaults, resolved by transformers' own merge (the one `generate` runs)."""
    config, _ = model._prepare_generation_config(None, **kwargs)
    return {f: getattr(config, f) for f in SAMPLING_FIELDS if getattr(config, f, None) is not None}


def checkpoint_defaults(model) -> dict[str, Any]:
    """What the checkpoint's generation_config sets for sampling beyond transformers' defaults (an instruct model's
    temperature, top_k, repetition_penalty): recorded beside the settings applied, which override them."""
    from transformers import GenerationConfig

    plain, own = GenerationConfig(), model.generation_config
    return {f: getattr(own, f) for f in SAMPLING_FIELDS if getattr(own, f, None) not in (None, getattr(plain, f, None))}


def recorded_settings(model, tokenizer, *, max_new_tokens: int, n: int, temperature: float, top_p: float) -> dict:
    """What an evaluation records of its sampler: the settings applied to its greedy and its sampled completions,
    and what the checkpoint's generation_config asked for that was not applied (only where they differ)."""
    common = {"max_new_tokens": max_new_tokens, "pad": tokenizer.pad_token_id, "stop": stop_token_ids(model, tokenizer)}
    greedy = applied_settings(model, generation_kwargs(**common, n=1, temperature=None, top_p=1.0))
    sampled = applied_settings(model, generation_kwargs(**common, n=n, temperature=temperature, top_p=top_p))
    own = checkpoint_defaults(model)
    overridden = {f: v for f, v in own.items() if sampled.get(f) != v or greedy.get(f) != v}
    return {"greedy": greedy, "sampled": sampled, **({"checkpoint_not_applied": overridden} if overridden else {})}


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end a completion, as TRL's GRPOTrainer collects them: the tokenizer's EOS first, then the
    model's generation_config.eos_token_id (an int or a list; trl/trainer/grpo_trainer.py, `eos_token_ids`)."""
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    eos = tokenizer.eos_token_id
    return ids if eos is None or eos in ids else [eos, *ids]


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
    prompts (left padding); a chat prompt is rendered with the tokenizer's chat template first (`render_prompt`).

    Prompts are tokenized as TRL's GRPOTrainer tokenizes them: a plain prompt with the tokenizer's special tokens (the
    BOS a Llama-type tokenizer adds), a chat prompt as its template renders it (a template writes its own BOS)."""
    import torch

    require_temperature(n, temperature)
    stop = stop_token_ids(model, tokenizer)
    settings = generation_kwargs(
        max_new_tokens=max_new_tokens, n=n, temperature=temperature, top_p=top_p, pad=tokenizer.pad_token_id, stop=stop
    )
    per_batch = max(1, batch_size // n)
    starts = range(0, len(prompts), per_batch)
    texts: list[list[str]] = []
    ids: list[list[list[int]]] = []
    for start in tqdm(starts, desc=desc, unit="batch", leave=False, disable=len(starts) <= 1):
        batch = prompt_ids(tokenizer, prompts[start : start + per_batch])
        enc = {k: v.to(model.device) for k, v in left_padded(batch, settings["pad_token_id"]).items()}
        with torch.no_grad():
            gen = generate_rows(model, enc, settings)
        new = gen[:, enc["input_ids"].shape[1] :]
        decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
        kept = [completion_ids(row, stop) for row in new.tolist()]
        texts.extend(decoded[i * n : (i + 1) * n] for i in range(len(batch)))
        ids.extend(kept[i * n : (i + 1) * n] for i in range(len(batch)))
    return texts, ids


def generate_rows(model, enc: dict[str, Any], settings: dict[str, Any]):
    """`model.generate(**enc, **settings)`: the (B*n, width + new tokens) ids it returns, with each prompt run once for
    its n samples. generate copies every prompt n times (num_return_sequences) and runs each copy through the model;
    on the default recipe (6-token prompts, 5 new tokens, n=8) about half of a sampled batch's work was the same
    prompts run again. Here the prompts' tokens but the last run once (`shared_prompt_cache`), their cache is copied
    to the n rows, and generate goes on from it with the rows it would have made itself (copies side by side): the
    same positions, masks and random draws, and logits equal up to float rounding (within 5e-7 on the tiny model)."""
    import torch

    n, width = settings["num_return_sequences"], enc["input_ids"].shape[1]
    # a static cache (generation_config.cache_implementation) is generate's own to build
    if n == 1 or width < 2 or getattr(model.generation_config, "cache_implementation", None):
        return model.generate(**enc, **settings)
    cache = shared_prompt_cache(model, enc, n)
    rows = {k: torch.repeat_interleave(v, n, dim=0) for k, v in enc.items()}
    return model.generate(**rows, **{**settings, "num_return_sequences": 1}, **{cache_argument(model): cache})


def shared_prompt_cache(model, enc: dict[str, Any], n: int):
    """The KV cache of the left-padded prompts `enc` without their last token, computed once per prompt and repeated
    n times per prompt (rows i*n .. i*n+n-1 are prompt i's): generate then runs only the last prompt token per row."""
    import torch
    from transformers import DynamicCache

    ids, mask = enc["input_ids"][:, :-1], enc["attention_mask"][:, :-1]
    # positions as generate numbers them under left padding, from 0 at the first real token
    # (transformers' GenerationMixin._prepare_position_ids_for_generation)
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    cache = DynamicCache(config=model.config)
    # only the last position's logits are computed (none are used): the lm head over a whole prompt is wasted work
    last = {"logits_to_keep": 1} if "logits_to_keep" in forward_arguments(model) else {}
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, cache_argument(model): cache}
    with torch.no_grad():
        model(**inputs, use_cache=True, **last)
    cache.batch_repeat_interleave(n)
    return cache


def forward_arguments(model) -> set[str]:
    """The argument names of `model.forward`."""
    import inspect

    return set(inspect.signature(model.forward).parameters)


def cache_argument(model) -> str:
    """The name the installed transformers gives the KV cache argument of forward and generate: `cache` in recent
    releases, `past_key_values` in older ones (which the newer still take, with a deprecation warning)."""
    return "cache" if "cache" in forward_arguments(model) else "past_key_values"


def require_temperature(n: int, temperature: float | None) -> None:
    """Several completions per prompt are samples: greedy ones would all be the same."""
    if n > 1 and temperature is None:
        raise ValueError(f"{n} completions per prompt need a sampling temperature; greedy ones would all be the same")


def left_padded(batch: list[list[int]], pad: int | None) -> dict[str, Any]:
    """`batch` as a decoder-only model's generate takes it: padded on the left with `pad` (0 where the tokenizer has
    no pad token: masked out either way), with the attention mask."""
    import torch

    width = max(map(len, batch))
    ids = [[pad or 0] * (width - len(x)) + list(x) for x in batch]
    mask = [[0] * (width - len(x)) + [1] * len(x) for x in batch]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def prompt_ids(tokenizer, prompts: Sequence[Any]) -> list[list[int]]:
    """Each stored prompt's token ids as TRL's GRPOTrainer tokenizes it (agents/episodes.py `prompt_ids`: text with
    the tokenizer's special tokens, a chat prompt as its template renders it). Pass the stored prompts, not rendered
    text: rendered chat is plain text."""
    prompts = [as_prompt(p) for p in prompts]
    if any(isinstance(p, list) for p in prompts):
        require_chat_template(tokenizer, getattr(tokenizer, "name_or_path", "the model"))
    return trl_prompt_ids(tokenizer, prompts)


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
