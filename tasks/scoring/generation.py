"""Batched generation for the evaluation, the difficulty filter and the held-out accuracy probe: left padding,
greedy or n samples per prompt, each completion cut at the first stop token as TRL's GRPOTrainer cuts it, with its
token ids (`completion_ids`, so a length measured in tokens is the same here as in training)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from grpo_pipeline.tasks.scoring.chat import decode_messages, render_prompt


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
    prompts (left padding); a chat prompt is rendered with the tokenizer's chat template first (`render_prompt`).

    Prompts are tokenized as TRL's GRPOTrainer tokenizes them: a plain prompt with the tokenizer's special tokens (the
    BOS a Llama-type tokenizer adds), a chat prompt as its template renders it (a template writes its own BOS)."""
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
        chunk = prompts[start : start + per_batch]
        plain = all(decode_messages(p) is None for p in chunk)
        batch = [render_prompt(tokenizer, p) for p in chunk]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=plain).to(model.device)
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
