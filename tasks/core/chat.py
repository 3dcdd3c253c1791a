"""Chat-formatted prompts: messages in the data, the tokenizer's chat template at every place a model reads them.

With `data.prompt_format: chat`, each prompt is a list of messages (`[system?, user]`, TRL's conversational
format), stored in the Parquet splits as a JSON string so that every pandas step (split, validation, eval items)
keeps working on plain strings. Each consumer turns it back into messages:

- SFT: TRL's conversational prompt-completion format, the completion as one assistant message
  (`conversational_dataset`); SFTTrainer applies the chat template to both.
- GRPO: the conversational prompt; GRPOTrainer applies the template itself, and hands rewards each completion as
  `[{"role": "assistant", "content": ...}]` (trl/trainer/grpo_trainer.py, `_generate_and_score_completions`), which
  `completion_text` reads.
- Evaluation, the held-out probe and the difficulty filter: `render_prompt` applies the same template
  (`add_generation_prompt=True`) before their own batched `generate`, and rewards get the messages, as under TRL.

A prompt is chat when it decodes to a non-empty list of `{"role", "content"}` objects; validation
(tasks/sources/contract.py) checks that every row of a chat dataset does, so one row decides for a whole split.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

Message = dict[str, str]
ROLES = ("system", "user", "assistant")


class ChatTemplateError(ValueError):
    """Chat prompts meet a tokenizer that has no chat template; the message names the model and the fix."""


def build_messages(question: str, system_prompt: str | None = None) -> list[Message]:
    """The messages of one prompt: the system prompt (when set), then the question as the user's message."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": question}]


def plain(value: Any) -> Any:
    """`value` with NumPy arrays (how pandas reads a Parquet list column) turned into lists, at any depth."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def encode_messages(messages: Sequence[Any]) -> str:
    """The stored form of a chat prompt: its messages as JSON (non-ASCII kept as is)."""
    return json.dumps(plain(messages), ensure_ascii=False)


def message_problem(value: Any) -> str | None:
    """Why `value` (a stored prompt) is not a usable chat prompt, or None when it is one: a JSON list of
    messages, each with a known role and non-blank text content, the last from the user (the model answers it)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return "is not JSON chat messages"
    value = plain(value)
    if not isinstance(value, list) or not value:
        return "is not a non-empty list of messages"
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not {"role", "content"} <= m.keys():
            return f"message {i} is not an object with 'role' and 'content'"
        if m["role"] not in ROLES:
            return f"message {i} has role {m['role']!r}, not one of {list(ROLES)}"
        if not isinstance(m["content"], str) or not m["content"].strip():
            return f"message {i} ({m['role']}) has no text content"
    if value[-1]["role"] != "user":
        return f"the last message is from the {value[-1]['role']}, not the user"
    return None


def decode_messages(value: Any) -> list[Message] | None:
    """The messages of a stored chat prompt (a JSON string, or a list of messages), or None for a plain-text
    prompt or anything that is not well-formed chat."""
    if isinstance(value, str):
        if not value.lstrip().startswith("["):
            return None
        try:
            value = json.loads(value)
        except ValueError:
            return None
    value = plain(value)
    return value if message_problem(value) is None else None


def completion_text(completion: Any) -> str:
    """The text of a completion: a plain string, or the last message's content in chat format."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    raise TypeError(f"completion of type {type(completion).__name__} is neither a string nor chat messages")


def as_prompt(value: Any) -> str | list[Message]:
    """A prompt as TRL and the rewards see it: the messages of a chat prompt, the text of any other."""
    messages = decode_messages(value)
    return value if messages is None else messages


def as_completion(prompt: Any, text: str) -> str | list[Message]:
    """A completion as GRPOTrainer hands it to rewards: for a chat prompt (`as_prompt`'s messages) one assistant
    message, for a text prompt the text."""
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


def prompt_chars(value: Any) -> int:
    """The length of a prompt in characters: its text, or the summed content of its messages."""
    messages = decode_messages(value)
    return len(value) if messages is None else sum(len(m["content"]) for m in messages)


def preview(value: Any) -> str:
    """A short readable form of a prompt for messages and logs: a chat prompt's last user message."""
    messages = decode_messages(value)
    return str(value) if messages is None else messages[-1]["content"]


def render_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Any) -> str:
    """The text the model reads for `prompt`: a chat prompt rendered with the tokenizer's chat template up to the
    start of the assistant's turn, a plain prompt as it is. Rendering an already rendered prompt changes nothing."""
    messages = decode_messages(prompt)
    if messages is None:
        return prompt
    require_chat_template(tokenizer, getattr(tokenizer, "name_or_path", "the model"))
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def require_chat_template(tokenizer: PreTrainedTokenizerBase, model: str) -> None:
    """Raise ChatTemplateError unless the tokenizer can render chat prompts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"the prompts are chat messages (data.prompt_format: chat) but the tokenizer of {model} has no chat "
            "template; use a chat/instruct model, or set data.prompt_format=text"
        )


def is_chat_dataset(ds: Dataset) -> bool:
    """Whether a split's prompts are chat messages (validation made every row agree with the first)."""
    return len(ds) > 0 and decode_messages(ds[0]["prompt"]) is not None


def conversational_dataset(ds: Dataset, tokenizer: PreTrainedTokenizerBase, model: str) -> Dataset:
    """A split in TRL's conversational format when its prompts are chat: the prompt as messages and, where there is
    a `completion` column (the SFT target), the completion as one assistant message. Text splits come back as
    they are."""
    if not is_chat_dataset(ds):
        return ds
    require_chat_template(tokenizer, model)

    def to_messages(row: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": decode_messages(row["prompt"])}
        if "completion" in row:
            out["completion"] = [{"role": "assistant", "content": row["completion"]}]
        return out

    return ds.map(to_messages, desc="chat messages")
