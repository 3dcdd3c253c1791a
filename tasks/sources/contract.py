"""The data contract every later stage relies on (pandera, lazy validation): the validate stage checks the prepared
splits with it (tasks/validate.py), the suite stage each evaluation suite (tasks/suites.py).

All splits are validated together so that the contract can see across them (no prompt may be in two). Prompts
are compared with their whitespace collapsed: `"12+7="` and `"12+7= "` are one question, and the split, which
works on exact strings, can put such a pair on both sides. Every failing row is reported with its split, row
number, column and check; nothing downstream runs on bad data. Chat prompts (data.prompt_format: chat, stored as
the JSON of their messages, tasks/core/chat.py) must each be well-formed messages, and their length is that of their
messages' content.
"""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors
from pandera.typing import Series

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.tasks.core import chat


class DataValidationError(ValueError):
    """The prepared data breaks the contract; `failures` holds one row per failing (row, check)."""

    def __init__(self, message: str, failures: pd.DataFrame):
        super().__init__(message)
        self.failures = failures


def same_question(prompts: pd.Series) -> pd.Series:
    """The key under which two prompts count as the same question: the text with runs of whitespace collapsed (of
    a chat prompt: its roles and contents)."""
    return prompts.map(lambda p: " ".join(_prompt_words(p)) if isinstance(p, str) else p)


def _prompt_words(prompt: str) -> list[str]:
    messages = chat.decode_messages(prompt)
    if messages is None:
        return prompt.split()
    return [word for m in messages for word in [f"<{m['role']}>", *m["content"].split()]]


CHAT_CHECK = "prompt_is_chat_messages"


def make_schema(min_prompt_chars: int, max_prompt_chars: int, chat_prompts: bool = False) -> type[pa.DataFrameModel]:
    """The contract, with the configured prompt length bounds; with `chat_prompts`, for JSON chat messages."""

    class PromptDataset(pa.DataFrameModel):
        split: Series[str] = pa.Field(isin=["train", "eval", "probe"])
        prompt: Series[str] = pa.Field(
            nullable=False, str_length={"min_value": min_prompt_chars, "max_value": max_prompt_chars}
        )
        answer: Series[str] = pa.Field(nullable=False)
        completion: Series[str] = pa.Field(nullable=False)

        @pa.check("prompt", name="prompt_not_blank")
        def _prompt_not_blank(cls, s: Series[str]) -> Series[bool]:
            return s.str.strip().str.len() > 0

        @pa.check("answer", name="answer_not_blank")
        def _answer_not_blank(cls, s: Series[str]) -> Series[bool]:
            return s.str.strip().str.len() > 0

        @pa.dataframe_check(name="no_duplicate_prompts_within_split")
        def _unique_within_split(cls, df: pd.DataFrame) -> Series[bool]:
            return ~df.assign(key=same_question(df["prompt"])).duplicated(subset=["split", "key"], keep="first")

        @pa.dataframe_check(name="no_prompt_in_both_train_and_eval")
        def _no_overlap(cls, df: pd.DataFrame) -> Series[bool]:
            key = same_question(df["prompt"])
            train = set(key[df["split"] == "train"])
            return ~((df["split"] == "eval") & key.isin(train))

        @pa.dataframe_check(name="no_probe_prompt_in_train_or_eval")
        def _probe_apart(cls, df: pd.DataFrame) -> Series[bool]:
            key = same_question(df["prompt"])
            seen = set(key[df["split"] != "probe"])  # the probe chooses checkpoints: it must see no scored item
            return ~((df["split"] == "probe") & key.isin(seen))

        class Config:
            strict = False
            coerce = False

    if not chat_prompts:
        return PromptDataset

    class ChatPromptDataset(PromptDataset):
        prompt: Series[str] = pa.Field(nullable=False)  # the length bounds apply to the content, not to the JSON

        @pa.check("prompt", name=CHAT_CHECK)
        def _well_formed(cls, s: Series[str]) -> Series[bool]:
            return s.map(lambda p: chat.message_problem(p) is None)

        @pa.check("prompt", name="chat_content_length")
        def _content_length(cls, s: Series[str]) -> Series[bool]:
            return s.map(
                lambda p: (
                    chat.message_problem(p) is not None  # reported by the check above, not twice
                    or min_prompt_chars <= chat.prompt_chars(p) <= max_prompt_chars
                )
            )

    return ChatPromptDataset


def _describe(failures: pd.DataFrame, combined: pd.DataFrame, limit: int = 50) -> str:
    lines = []
    # A dataframe-wide check reports each column of a failing row; one line per (row, check) is enough.
    failures = failures.drop_duplicates(subset=["index", "check"])
    for _, f in failures.iterrows():
        idx = f["index"]
        if idx is None or pd.isna(idx):
            lines.append(f"  - column {f['column']!r}: check {f['check']!r} failed ({f['failure_case']!r})")
            continue
        row = combined.loc[int(idx)]
        prompt = chat.preview(row["prompt"])[:60]
        why = f": {chat.message_problem(row['prompt'])}" if f["check"] == CHAT_CHECK else ""
        lines.append(
            f"  - {row['split']} row {int(row['row'])}: "
            + (f"column {f['column']!r} " if f["schema_context"] == "Column" else "")
            + f"failed {f['check']!r}{why} (prompt {prompt!r})"
        )
    more = len(lines) - limit
    return "\n".join(lines[:limit] + ([f"  ... and {more} more"] if more > 0 else []))


def validate_frames(
    train: pd.DataFrame, held_out: pd.DataFrame, cfg: DataConfig, probe: pd.DataFrame | None = None
) -> None:
    """Raise DataValidationError naming every bad row, or return None when the data meets the contract."""
    splits = {"train": train, "eval": held_out, **({"probe": probe} if probe is not None else {})}
    combined = pd.concat(
        [frame.assign(split=name, row=range(len(frame))) for name, frame in splits.items()], ignore_index=True
    )
    for col in ("prompt", "answer", "completion"):
        if col not in combined:
            raise DataValidationError(f"the prepared data has no {col!r} column", pd.DataFrame())
    schema = make_schema(cfg.min_prompt_chars, cfg.max_prompt_chars, chat_prompts=cfg.prompt_format == "chat")
    try:
        schema.validate(combined, lazy=True)
    except SchemaErrors as e:
        failures = e.failure_cases
        n_rows = failures["index"].dropna().nunique()
        n_failures = len(failures.drop_duplicates(subset=["index", "check"]))
        raise DataValidationError(
            f"data validation failed: {n_failures} failure(s) in {n_rows} row(s):\n{_describe(failures, combined)}",
            failures,
        ) from None
