"""Length rewards measure the same completion in the same unit in training and in evaluation: evaluation passes the
generated tokens as `completion_ids`, as TRL's GRPOTrainer does (up to and including the first EOS)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_pipeline.agents.episodes import completion_ids
from grpo_pipeline.configs.schema import EvalConfig, RewardSpec
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.core.common import Ref, fingerprint_path
from grpo_pipeline.tasks.scoring.evaluation import evaluate_model

SPECIAL = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
WORDS = ["ab", "cde", "fghi", "jk", "lmnop", "q", "rs", "tuvw"]  # tokens of several characters: chars != tokens
OVERLONG = RewardSpec(name="overlong", params={"max_len": 8, "cache_len": 8})


def word_model(out: Path) -> Path:
    vocab = {tok: i for i, tok in enumerate([*SPECIAL.values(), *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left", **SPECIAL)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, 2
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_completion_ids_stop_after_the_first_eos():
    assert completion_ids([5, 6, 2, 0, 0], [2]) == [5, 6, 2]
    assert completion_ids([5, 6, 7], [2]) == [5, 6, 7]
    assert completion_ids([9, 3, 2], [3, 2]) == [9, 3]


def test_a_length_reward_scores_a_completion_the_same_in_training_and_evaluation(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = word_model(tmp_path / "m")
    prompts = ["ab cde", "jk q", "rs ab", "q q"]  # the same length in tokens: no padding differs between the two
    # training: TRL's GRPOTrainer calls the reward; top_k=1 makes its sampling greedy, so evaluation can reproduce it
    overlong = build_reward(OVERLONG.name, OVERLONG.params)
    trained: dict[str, tuple[str, float]] = {}

    def recorded(prompts, completions, **kwargs):
        scores = overlong(prompts=prompts, completions=completions, **kwargs)
        trained.update(zip(prompts, zip(completions, scores, strict=True), strict=True))
        return scores

    recorded.__name__ = "overlong"
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=16, num_generations=4,
        max_completion_length=4, top_k=1, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
    )  # fmt: skip
    GRPOTrainer(
        model=str(model), reward_funcs=[recorded], args=args, train_dataset=Dataset.from_dict({"prompt": prompts})
    ).train()
    assert len(trained) == 4

    # evaluation: one sample per prompt with a nucleus so small that only the most likely token is kept
    path = tmp_path / "eval.parquet"
    pd.DataFrame({"prompt": prompts, "answer": ["x"] * 4}).to_parquet(path)
    held_out = Ref(path=str(path), fingerprint=fingerprint_path(path))
    cfg = EvalConfig(n_samples=1, k=[1], max_new_tokens=4, top_p=1e-6, max_unscored_fraction=1.0)
    items = evaluate_model(str(model), held_out, cfg, seed=0, out=tmp_path / "e", rewards=[OVERLONG]).items()
    for prompt, samples, rewards in zip(items["prompt"], items["samples"], items["sample_rewards"], strict=True):
        text, score = trained[prompt]
        assert samples[0] == text  # the same completion ...
        assert rewards["overlong"][0] == score  # ... has the same score
    # ... which a count of characters would not give (the test can tell the units apart)
    in_chars = build_reward(OVERLONG.name, {**OVERLONG.params, "unit": "chars"})
    texts = [text for text, _ in trained.values()]
    assert in_chars(prompts=list(trained), completions=texts) != [score for _, score in trained.values()]


def test_prompts_are_tokenized_as_training_tokenizes_them(tmp_path):
    """A Llama-type tokenizer adds a BOS to a plain prompt, as TRL's GRPOTrainer tokenizes it (the tokenizer's
    special tokens); a rendered chat prompt is tokenized as its template wrote it, so the BOS is not doubled."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_pipeline.tasks.scoring.generation import generate_with_ids

    path = word_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)]
    )
    tokenizer.chat_template = "<s>{% for m in messages %}{{ m['content'] }} {% endfor %}"
    model = AutoModelForCausalLM.from_pretrained(path)
    seen: list[list[int]] = []
    real = model.generate

    def recording(**kwargs):
        seen.extend(kwargs["input_ids"].tolist())
        return real(**kwargs)

    model.generate = recording
    generate_with_ids(model, tokenizer, ["ab cde"], max_new_tokens=2, batch_size=4)
    chat = '[{"role": "user", "content": "ab cde"}]'
    generate_with_ids(model, tokenizer, [chat], max_new_tokens=2, batch_size=4)
    bos, ab, cde = tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("ab"), tokenizer.convert_tokens_to_ids("cde")
    assert seen[0] == [bos, ab, cde]  # the plain prompt: the BOS the tokenizer adds, as in training
    assert seen[1][:3] == [bos, ab, cde] and seen[1].count(bos) == 1  # the chat prompt: the template's BOS, once


def test_evaluation_tokenizes_its_chat_prompts_as_training_does(tmp_path, monkeypatch):
    """Evaluation hands generation the stored prompts, not their rendered text: rendered chat is plain text to a
    tokenizer, which would add its BOS before the template's own (two BOS tokens, never seen in training)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from grpo_pipeline.tasks.scoring import generation

    path = word_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.bos_token_id)]
    )
    tokenizer.chat_template = "<s>{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(path)
    rows = pd.DataFrame({"prompt": ['[{"role": "user", "content": "ab cde"}]', "ab cde"], "answer": ["q", "q"]})
    rows.to_parquet(tmp_path / "eval.parquet")
    held_out = Ref(path=str(tmp_path / "eval.parquet"), fingerprint=fingerprint_path(tmp_path / "eval.parquet"))
    seen: list[list[int]] = []
    real = generation.prompt_ids
    monkeypatch.setattr(
        generation, "prompt_ids", lambda tok, prompts: seen.extend(real(tok, prompts)) or real(tok, prompts)
    )
    cfg = EvalConfig(n_samples=1, k=[1], max_new_tokens=2, backend="hf", max_unscored_fraction=1.0)
    evaluate_model(str(path), held_out, cfg, seed=0, out=tmp_path / "eval")
    bos, ab, cde = tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("ab"), tokenizer.convert_tokens_to_ids("cde")
    assert seen[0][:3] == [bos, ab, cde] and seen[0].count(bos) == 1, seen[0]  # the template's BOS, once
    assert seen[1] == [bos, ab, cde]  # the plain prompt: the BOS the tokenizer adds, as in training
