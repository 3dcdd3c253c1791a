"""Evaluation's completions through vLLM (eval.backend: vllm, or auto where vLLM is installed): the same prompts,
tokenized as transformers' path and GRPO training tokenize them (`prompt_ids`), the same stop tokens and the same
cut at the first of them (`completion_ids`), sampled with eval's settings only (`generation_config="vllm"`: the
checkpoint's own sampling defaults are not applied, as in training), and the sampler recorded as vLLM applied it.
The engine is built once per evaluation, in the checkpoint's own dtype.

A tool-using recipe's episodes run through the same engine (tasks/scoring/vllm_episodes.py).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from grpo_pipeline.configs.schema import ConfigError
from grpo_pipeline.tasks.scoring.generation import (
    checkpoint_defaults,
    completion_ids,
    prompt_ids,
    require_temperature,
    stop_token_ids,
)

# What the record of a vLLM sampler keeps (SamplingParams' fields that change which tokens are drawn).
SAMPLING_FIELDS = ("max_tokens", "n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                   "presence_penalty", "frequency_penalty")  # fmt: skip


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def uses_vllm(backend: str) -> bool:
    """Whether eval.backend `backend` generates through vLLM here; 'vllm' without the package is refused."""
    if backend == "vllm" and not vllm_installed():
        raise ConfigError(
            "eval.backend is 'vllm' but the vllm package is not installed here: pip install -e '.[gpu]' on CUDA "
            "(make test-vllm builds vLLM's CPU build in .venv-vllm), or set eval.backend=hf (or auto)"
        )
    return backend == "vllm" or (backend == "auto" and vllm_installed())


class VLLMGenerator:
    """One vLLM engine over the checkpoint at `path`, generating as `generate_with_ids` does."""

    def __init__(self, path: str, tokenizer: Any, seed: int, max_len: int | None = None) -> None:
        """`max_len`: the longest sequence the engine takes; the checkpoint's own (max_position_embeddings) if None."""
        import torch
        from transformers import AutoConfig, GenerationConfig
        from vllm import LLM

        config = AutoConfig.from_pretrained(path)
        self.tokenizer = tokenizer
        self.seed = seed
        # The checkpoint's own dtype, as transformers loads it: vLLM's "auto" would run a float32 checkpoint (a policy
        # as trained) in half precision, and its greedy completions would differ from generate's.
        self.dtype = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
        self.max_len = max_len or config.max_position_embeddings
        self.llm = LLM(  # one seed for the engine: each request draws from its stream in turn, reproducibly
            model=path, seed=seed, max_model_len=self.max_len, enforce_eager=True,
            generation_config="vllm", dtype=self.dtype,
            **({"gpu_memory_utilization": 0.3} if torch.cuda.is_available() else {}),
        )  # fmt: skip
        self.own = SimpleNamespace(generation_config=GenerationConfig.from_pretrained(path))
        self.stop = stop_token_ids(self.own, tokenizer)

    def params(
        self, *, max_new_tokens: int, n: int = 1, temperature: float | None = None, top_p: float = 1.0,
        pause: Sequence[int] = (),
    ) -> Any:  # fmt: skip
        """The sampler for eval's settings; `pause`: more token ids to stop at (the text tool loop's)."""
        from vllm import SamplingParams

        require_temperature(n, temperature)
        sample = temperature is not None
        return SamplingParams(
            n=n, temperature=temperature if sample else 0.0, top_p=top_p if sample else 1.0,
            repetition_penalty=1.0, max_tokens=max_new_tokens, stop_token_ids=[*self.stop, *pause],
            skip_special_tokens=True, detokenize=False,
        )  # fmt: skip

    def generate_with_ids(
        self, prompts: Sequence[Any], *, max_new_tokens: int, batch_size: int = 0, n: int = 1,
        temperature: float | None = None, top_p: float = 1.0, desc: str = "generate",
    ) -> tuple[list[list[str]], list[list[list[int]]]]:  # fmt: skip
        """`n` completions for each prompt and their token ids, as `generation.generate_with_ids` returns them
        (vLLM batches by itself; `batch_size` is unused)."""
        from vllm.inputs import TokensPrompt

        params = self.params(max_new_tokens=max_new_tokens, n=n, temperature=temperature, top_p=top_p)
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids(self.tokenizer, prompts)]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        ids = [[completion_ids(o.token_ids, self.stop) for o in out.outputs] for out in outputs]
        texts = [[self.tokenizer.decode(c, skip_special_tokens=True) for c in per] for per in ids]
        return texts, ids

    def recorded(self, *, max_new_tokens: int, n: int, temperature: float, top_p: float) -> dict[str, Any]:
        """The record `generation.recorded_settings` makes, for vLLM's sampler."""

        def shown(params: Any) -> dict[str, Any]:
            return {f: getattr(params, f) for f in SAMPLING_FIELDS if getattr(params, f, None) is not None}

        greedy = shown(self.params(max_new_tokens=max_new_tokens))
        sampled = shown(self.params(max_new_tokens=max_new_tokens, n=n, temperature=temperature, top_p=top_p))
        own = checkpoint_defaults(self.own)
        return {"backend": "vllm", "dtype": self.dtype, "seed": self.seed, "greedy": greedy, "sampled": sampled,
                **({"checkpoint_not_applied": own} if own else {})}  # fmt: skip
