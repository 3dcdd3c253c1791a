"""Sampled batches run each prompt once for their n samples (`generation.generate_rows`): the rows, their order and
their seeded draws are those of `model.generate` with num_return_sequences, which runs every prompt n times, on
left-padded prompts of several lengths (one of a single token, whose shared part is all padding), for the Llama and
Qwen2 shapes the recipes use. Greedy batches are `generate` itself, and equal one prompt at a time."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_pipeline.configs.schema import TinyModelConfig
from grpo_pipeline.tasks.scoring.generation import (
    generate_rows,
    generate_with_ids,
    generation_kwargs,
    left_padded,
    prompt_ids,
    stop_token_ids,
)
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

PROMPTS = ["1+1=", "12+34=", "7", "999+1000=", "3+4=", "50+50="]
SHAPES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    cfg = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return AutoTokenizer.from_pretrained(build_tiny_model(cfg, tmp_path_factory.mktemp("tiny") / "m", 0))


def random_model(shape: str, tokenizer):
    config_class, model_class = SHAPES[shape]
    config = config_class(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    return model_class(config).eval()


def batch(model, tokenizer, *, n: int, temperature: float | None, top_p: float = 1.0):
    settings = generation_kwargs(
        max_new_tokens=6, n=n, temperature=temperature, top_p=top_p, pad=tokenizer.pad_token_id,
        stop=stop_token_ids(model, tokenizer),
    )  # fmt: skip
    return left_padded(prompt_ids(tokenizer, PROMPTS), tokenizer.pad_token_id), settings


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("n", "top_p"), [(4, 1.0), (3, 0.8)])
def test_sampled_rows_are_generates_own_draws(tokenizer, shape, n, top_p):
    model = random_model(shape, tokenizer)
    enc, settings = batch(model, tokenizer, n=n, temperature=1.0, top_p=top_p)
    for seed in range(3):
        torch.manual_seed(seed)
        plain = model.generate(**enc, **settings)
        torch.manual_seed(seed)
        shared = generate_rows(model, enc, settings)
        assert plain.shape == (len(PROMPTS) * n, enc["input_ids"].shape[1] + 6)
        assert torch.equal(shared, plain), f"seed {seed}: the samples differ from generate's"


def test_each_prompt_runs_once_for_its_samples(tokenizer):
    model = random_model("qwen2", tokenizer)
    enc, settings = batch(model, tokenizer, n=8, temperature=1.0)
    shapes: list[tuple[int, int]] = []
    model.get_input_embeddings().register_forward_pre_hook(lambda _, args: shapes.append(tuple(args[0].shape)))
    generate_rows(model, enc, settings)
    rows, width = enc["input_ids"].shape
    # the prompts without their last token once, then one token at a time in each of the 8 x rows
    assert shapes[0] == (rows, width - 1)
    assert all(s == (rows * 8, 1) for s in shapes[1:]) and len(shapes) == 1 + 6


def test_greedy_batches_are_generate_and_equal_one_prompt_at_a_time(tokenizer):
    model = random_model("llama", tokenizer)
    enc, settings = batch(model, tokenizer, n=1, temperature=None)
    assert torch.equal(generate_rows(model, enc, settings), model.generate(**enc, **settings))
    kwargs = {"max_new_tokens": 6, "batch_size": 64}
    batched = generate_with_ids(model, tokenizer, PROMPTS, **kwargs)
    alone = [generate_with_ids(model, tokenizer, [p], **kwargs) for p in PROMPTS]
    assert batched == ([t for texts, _ in alone for t in texts], [i for _, ids in alone for i in ids])
