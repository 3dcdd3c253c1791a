"""The embedded default model: a char-level tokenizer and a tiny Llama-shaped decoder, built locally.

Nothing is downloaded. The result is saved as an ordinary Hugging Face directory, so every later stage loads it
with `from_pretrained(path)` exactly as it would load a hub model.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_pipeline.configs.schema import TinyModelConfig
from grpo_pipeline.tasks.core.common import atomic_dir

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# Every printable ASCII character plus newline, so any English prompt tokenizes without <unk>.
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
# A small chat template (data.prompt_format: chat) written in characters the vocabulary already has, so the
# vocabulary and the model's weights are the same with or without it:
#   <|system|>Add the numbers.\n<|user|>12+7=\n<|assistant|>19</s>
# The prompt rendered with add_generation_prompt ends at "<|assistant|>" and is a prefix of the prompt with its
# answer, so TRL's SFT trains on the answer and the EOS that closes the assistant's turn (the model learns to stop).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{%- if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\n' }}{% endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{% endif -%}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A char-level tokenizer: one token per character; special tokens are matched whole. It carries a chat
    template (`CHAT_TEMPLATE`) for chat-formatted prompts."""
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS.values(), *CHARACTERS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every char its own piece
    tok.decoder = decoders.Fuse()  # join tokens without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, padding_side="left", chat_template=CHAT_TEMPLATE, **SPECIAL_TOKENS
    )


def build_tiny_model(cfg: TinyModelConfig, out_dir: str | Path, seed: int) -> Path:
    """Build, initialise (seeded) and save the tiny model and its tokenizer to `out_dir`."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(out_dir)
