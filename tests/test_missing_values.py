"""One rule for a missing cell (tasks/core/values.py), read alike by the training sources, the eval adapters and the
code formats."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.tasks.core.values import is_blank, is_missing
from grpo_pipeline.tasks.scoring.formats import load_eval_rows
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.tables import map_columns


@pytest.mark.parametrize("value", [None, math.nan, float("nan"), pd.NA, pd.NaT])
def test_pandas_absent_cells_are_missing_and_blank(value: object) -> None:
    assert is_missing(value) and is_blank(value)


@pytest.mark.parametrize("value", ["", " \n\t"])
def test_a_blank_string_is_blank_but_not_missing(value: str) -> None:
    assert is_blank(value) and not is_missing(value)


@pytest.mark.parametrize("value", ["0", "x", 0, 0.0, False, [], {}])
def test_values_are_neither(value: object) -> None:
    assert not is_missing(value) and not is_blank(value)


def test_a_training_answer_left_as_pandas_na_is_missing_not_the_text_na() -> None:
    raw = pd.DataFrame({"prompt": ["1+1=", "2+2="], "answer": pd.Series(["2", pd.NA], dtype=object)})
    out = map_columns(raw, DataConfig(source="file", path="x.jsonl"), origin="data file x.jsonl")
    assert out.loc[0, "answer"] == "2" and is_missing(out.loc[1, "answer"])  # not "<NA>", which no completion matches


def test_an_eval_answer_of_whitespace_only_is_empty() -> None:
    # the eval adapters kept only "" as empty; whitespace has no answer in it either, so it is refused by row
    with pytest.raises(DataError, match=r"column 'answer' is empty in 1 row"):
        load_eval_rows(pd.DataFrame({"prompt": ["1+1=", "2+2="], "answer": ["2", "  "]}))
