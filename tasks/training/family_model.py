"""A tiny, locally built stand-in for a hub model: the same architecture class, the same kind of tokenizer (byte-level
BPE with the family's special tokens and chat template) and the same generation defaults, with dimensions small
enough to train on a CPU in seconds. `grpo-pipeline rehearse` runs a real recipe's DAG on it, so every code path
that depends on the architecture (its config class, attention layout, tied embeddings, chat template, EOS handling,
LoRA target modules) is exercised before a GPU is paid for. The tokenizer is trained on the recipe's own data.

Nothing is downloaded: a family is recognised from a local directory's `config.json` or from the hub name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from grpo_pipeline.configs.base import ConfigError
from grpo_pipeline.tasks.core.common import atomic_dir

# Qwen2's own pre-tokenizer split, so the BPE trained here splits text as the real tokenizer does.
QWEN2_SPLIT = PRETOKENIZE_REGEX


def qwen2_5_template() -> str:
    """Qwen2.5's own chat template, tool-calling branches included, from TRL's copy (trl/chat_templates/qwen2_5.jinja,
    the text TRL matches to parse tool calls and patch training templates): read from the installed package, never
    downloaded, so a stand-in renders tools and tool messages exactly as Qwen2.5-Instruct does."""
    import importlib.util

    spec = importlib.util.find_spec("trl")  # finds the package without importing it
    if spec is None or spec.origin is None:
        raise ConfigError("the Qwen2.5 stand-in takes its chat template from TRL's copy; install trl (pip install trl)")
    return (Path(spec.origin).parent / "chat_templates" / "qwen2_5.jinja").read_text()


# Qwen2.5's chat template without its tool-calling branches (ChatML, with Qwen's default system turn): a template that
# cannot carry tool calls, for tests of what the pipeline says about such a model.
CHATML = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Llama 3's chat template, without tools and dates.
LLAMA3 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Family:
    """What a family's checkpoints share: architecture, special tokens, chat template, tokenizer class."""

    model_type: str  # transformers' model_type (AutoConfig.for_model)
    architecture: str
    tokenizer_class: str
    text_end: str  # ends a document (a base model's EOS; pads too)
    turn_end: str  # ends an assistant turn (an instruct model's EOS)
    bos: str | None  # prepended to every encoded text where the family does so
    specials: tuple[str, ...]
    chat_template: str
    split: str  # the pre-tokenizer's regex
    # Generation defaults an instruct checkpoint of this family ships (its generation_config.json), which
    # `generate` applies unless told otherwise.
    instruct_generation: dict[str, Any] = field(default_factory=dict)


FAMILIES = {
    "qwen2": Family(
        model_type="qwen2",
        architecture="Qwen2ForCausalLM",
        tokenizer_class="Qwen2Tokenizer",
        text_end="<|endoftext|>",
        turn_end="<|im_end|>",
        bos=None,
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        chat_template=qwen2_5_template(),  # Qwen2.5 base and instruct checkpoints ship this one
        split=QWEN2_SPLIT,
        # Qwen2.5-*-Instruct's generation_config.json.
        instruct_generation={
            "do_sample": True,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "repetition_penalty": 1.05,
        },
    ),
    "llama": Family(
        model_type="llama",
        architecture="LlamaForCausalLM",
        tokenizer_class="PreTrainedTokenizerFast",
        text_end="<|end_of_text|>",
        turn_end="<|eot_id|>",
        bos="<|begin_of_text|>",
        specials=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        chat_template=LLAMA3,
        split=QWEN2_SPLIT,
        instruct_generation={"do_sample": True, "temperature": 0.6, "top_p": 0.9},
    ),
}
# Hub names whose family is known without their config.json (lower case, first match wins).
NAME_HINTS = (("qwen2", "qwen2"), ("qwq", "qwen2"), ("llama", "llama"))

# Small enough to train on a CPU in seconds, shaped like the real thing: grouped-query attention, tied embeddings;
# heads of 32 dimensions, the smallest vLLM's CPU attention takes (so vLLM paths rehearse too).
TINY_DIMS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1, "max_position_embeddings": 4096, "tie_word_embeddings": True}  # fmt: skip
VOCAB_SIZE = 1024


def family_of(base: str) -> Family:
    """The family of `base`: a local checkpoint's `model_type`, else a hub name's; a clear error for any other."""
    config = Path(base) / "config.json"
    if config.is_file():
        model_type = json.loads(config.read_text()).get("model_type", "")
        if model_type in FAMILIES:
            return FAMILIES[model_type]
        raise ConfigError(
            f"{base} is a '{model_type}' model; a rehearsal can stand in for {', '.join(FAMILIES)} models. "
            "Rehearse with a checkpoint of one of those families"
        )
    for hint, name in NAME_HINTS:
        if hint in base.lower():
            return FAMILIES[name]
    raise ConfigError(
        f"cannot tell the architecture of model.base={base!r} without downloading it; a rehearsal can stand in for "
        f"{', '.join(FAMILIES)} models. Pass a local copy (model.base=/path/to/checkpoint) so its config.json says"
    )


def is_instruct(base: str) -> bool:
    """Whether `base` names a chat-tuned checkpoint (its EOS ends an assistant turn)."""
    name = base.lower()
    return any(tag in name for tag in ("instruct", "-chat", "-it"))


def build_tokenizer(family: Family, texts: list[str], instruct: bool, out: Path) -> Any:
    """A byte-level BPE of `VOCAB_SIZE` tokens trained on `texts`, with the family's special tokens, chat template
    and tokenizer class, saved to `out` (so `AutoTokenizer.from_pretrained` builds what it builds for the family)."""
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(family.split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(family.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: no text is ever out of vocabulary
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    eos = family.turn_end if instruct else family.text_end
    if family.bos:
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B",
            special_tokens=[(family.bos, bpe.token_to_id(family.bos))],
        )  # fmt: skip
    if family.tokenizer_class == "Qwen2Tokenizer":
        from transformers import Qwen2Tokenizer

        state = json.loads(bpe.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
        tokenizer = Qwen2Tokenizer(vocab=state["vocab"], merges=merges, eos_token=eos, pad_token=family.text_end,
                                   unk_token=None, chat_template=family.chat_template)  # fmt: skip
        tokenizer.add_special_tokens({"additional_special_tokens": list(family.specials[1:])})
    else:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=bpe, bos_token=family.bos, eos_token=eos, pad_token=family.text_end,
            chat_template=family.chat_template,
        )  # fmt: skip
    tokenizer.save_pretrained(out)
    return tokenizer


def build_family_model(base: str, texts: list[str], out_dir: str | Path, seed: int) -> Path:
    """Build a tiny model of `base`'s family (architecture, tokenizer trained on `texts`, chat template, generation
    defaults), initialised from `seed`, and save it to `out_dir` as an ordinary Hugging Face checkpoint."""
    family, instruct = family_of(base), is_instruct(base)
    with atomic_dir(out_dir) as tmp:
        tokenizer = build_tokenizer(family, texts, instruct, tmp)
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in family.specials}
        eos = [ids[family.turn_end], ids[family.text_end]] if instruct else ids[family.text_end]
        config = AutoConfig.for_model(
            family.model_type, vocab_size=len(tokenizer), pad_token_id=ids[family.text_end],
            bos_token_id=ids[family.bos] if family.bos else None, eos_token_id=eos, **TINY_DIMS,
        )  # fmt: skip
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=ids[family.text_end],
            **(family.instruct_generation if instruct else {}),
        )  # fmt: skip
        model.save_pretrained(tmp)
    return Path(out_dir)
