"""Eval adapters: each known benchmark format's rows mapped to the eval columns.

Every format ends as the same columns: `id` (the source's `task_id`, else the row number), `prompt` (what the model
sees), `answer` (the reference final answer; for code, the canonical solution or ""), plus what the correctness reward
reads: `test` + `entry_point` (HumanEval), `test_list` + `test_setup_code` (MBPP), or the test columns of the stdin/
stdout and call-based code formats below (rewards/code_formats/ parses them), stored as JSON text. The formats:

  - `gsm8k`: `question`, `answer` ending in `#### N` (Cobbe et al. 2021, "Training Verifiers to Solve Math Word
    Problems", github.com/openai/grade-school-math); the answer is N without thousands commas.
  - `boxed`: `problem` + `solution` whose last `\\boxed{...}` is the answer (Hendrycks et al. 2021, "Measuring
    Mathematical Problem Solving With the MATH Dataset"); an `answer` column, when present, is taken as is
    (MATH-500 and AIME-style tables carry one).
  - `humaneval`: `task_id`, `prompt`, `canonical_solution`, `test`, `entry_point` (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code"); the prompt is kept unchanged, since completions continue it.
  - `mbpp`: `text` + `test_list` (+ `test_setup_code`, `code`, `task_id`) (Austin et al. 2021, "Program Synthesis
    with Large Language Models"); the prompt is the paper's zero-shot form, the task then its tests. The sanitized
    split's `prompt` + `test_imports` columns are read too.
  - `apps` (APPS / TACO), `codecontests`, `livecodebench`, `open-r1`: the stdin/stdout and call-based code formats,
    each declared once as a `CodeFormat` in rewards/code_formats/ (which cites each dataset): the columns of its
    statement, id, reference solution (the first of APPS's `solutions`, the first Python 3 one of CodeContests',
    open-r1's `gold_standard_solution`; LiveCodeBench publishes none, so the answer is "") and tests. One mapper,
    `map_code_io`, reads them all: the prompt is the statement, the starter code when there is one, and how the
    solution is run (after LiveCodeBench's prompt, `lcb_runner/prompts/code_generation.py`); every row's tests are
    parsed at load.
  - `columns`: already `prompt` + `answer`; passed through with every other column.

Nothing is dropped: a row that cannot be mapped stops the load with a `DataError` naming the source, the rows and the
fix, because a benchmark scored on a silently shrunken set is not that benchmark.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from grpo_pipeline.rewards.code_formats import (
    EXTRA_TEST_COLUMNS,
    CodeFormat,
    ParsedTests,
    TestFormatError,
    json_text,
    parse_tests,
    string_list,
)
from grpo_pipeline.rewards.math import extract_gold, last_boxed
from grpo_pipeline.tasks.core.values import is_blank
from grpo_pipeline.tasks.sources import DataError

MAX_ROWS_SHOWN = 5


def _rows_error(origin: str, problem: str, rows: list[int], fix: str) -> DataError:
    """A DataError naming the first few offending rows (counted from 0, after `limit`)."""
    shown = ", ".join(str(r) for r in rows[:MAX_ROWS_SHOWN])
    more = f" and {len(rows) - MAX_ROWS_SHOWN} more" if len(rows) > MAX_ROWS_SHOWN else ""
    return DataError(f"{origin}: {problem} in {len(rows)} row(s) (counted from 0): {shown}{more}. {fix}")


def _require_values(raw: pd.DataFrame, column: str, origin: str) -> None:
    bad = [i for i, v in enumerate(raw[column]) if is_blank(v)]
    if bad:
        raise _rows_error(origin, f"column {column!r} is empty", bad, "Fill it in or remove those rows from the file.")


def _ids(raw: pd.DataFrame, column: str = "task_id") -> list[str]:
    if column in raw.columns:
        return [str(i) if is_blank(v) else str(v) for i, v in enumerate(raw[column])]
    return [str(i) for i in range(len(raw))]


def _text_or_empty(raw: pd.DataFrame, column: str) -> list[str]:
    if column not in raw.columns:
        return [""] * len(raw)
    return ["" if is_blank(v) else str(v) for v in raw[column]]


def _gsm8k_answer(solution: str) -> str | None:
    """N from a solution ending in `#### N` (commas dropped, as rewards.math does), or None when there is none."""
    _, hashes, tail = solution.rpartition("####")
    if not hashes or not tail.strip():
        return None
    return extract_gold(solution)


def map_gsm8k(raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """GSM8K (Cobbe et al. 2021): `question` -> prompt, the `#### N` of `answer` -> answer."""
    _require_values(raw, "question", origin)
    answers = [_gsm8k_answer(str(v)) for v in raw["answer"]]
    bad = [i for i, a in enumerate(answers) if a is None]
    if bad:
        raise _rows_error(
            origin,
            "the `answer` has no final `#### N`",
            bad,
            "GSM8K solutions end in '#### <number>'; fix those rows, or use fmt='columns' with a bare answer.",
        )
    return pd.DataFrame({"id": _ids(raw), "prompt": raw["question"].astype(str).tolist(), "answer": answers})


def _boxed_answer(answer: Any, solution: Any) -> str | None:
    if not is_blank(answer):
        return str(answer).strip()
    boxed = None if is_blank(solution) else last_boxed(str(solution))
    return boxed.strip() if boxed and boxed.strip() else None


def map_boxed(raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """MATH-style (Hendrycks et al. 2021): `problem` -> prompt; the `answer` column, else the solution's last
    `\\boxed{...}` -> answer."""
    _require_values(raw, "problem", origin)
    answers = [
        _boxed_answer(a, s) for a, s in zip(_text_or_empty(raw, "answer"), _text_or_empty(raw, "solution"), strict=True)
    ]
    bad = [i for i, a in enumerate(answers) if a is None]
    if bad:
        raise _rows_error(
            origin,
            "no answer: the `solution` has no non-empty \\boxed{...} and there is no `answer` value",
            bad,
            "Add \\boxed{<answer>} to those solutions, or an `answer` column.",
        )
    return pd.DataFrame({"id": _ids(raw), "prompt": raw["problem"].astype(str).tolist(), "answer": answers})


def map_passthrough(raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """Already prompt/answer: every column kept, `answer` as text, an `id` added when there is none."""
    for column in ("prompt", "answer"):
        _require_values(raw, column, origin)
    out = raw.assign(answer=[str(v) for v in raw["answer"]])
    if "id" not in out.columns:
        out.insert(0, "id", _ids(raw))
    return out


def map_humaneval(raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """HumanEval (Chen et al. 2021): the prompt unchanged (a completion continues it), tests and entry point kept."""
    for column in ("prompt", "test", "entry_point"):
        _require_values(raw, column, origin)
    return pd.DataFrame(
        {
            "id": _ids(raw),
            "prompt": raw["prompt"].astype(str).tolist(),
            "answer": _text_or_empty(raw, "canonical_solution"),
            "test": raw["test"].astype(str).tolist(),
            "entry_point": raw["entry_point"].astype(str).tolist(),
        }
    )


def mbpp_prompt(text: str, tests: list[str]) -> str:
    """The task, then the tests its code must pass (Austin et al. 2021, sec. 2.1, without the few-shot examples)."""
    return f"{text}\nYour code should pass these tests:\n" + "\n".join(tests) + "\n"


def _mbpp_setup(raw: pd.DataFrame) -> list[str]:
    """`test_setup_code`, or the sanitized split's `test_imports` joined into one setup block."""
    if "test_setup_code" in raw.columns:
        return _text_or_empty(raw, "test_setup_code")
    if "test_imports" in raw.columns:
        return ["\n".join(string_list(v) or []) for v in raw["test_imports"]]
    return [""] * len(raw)


def map_mbpp(raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """MBPP (Austin et al. 2021): the task text and its asserts -> prompt; asserts, setup and reference code kept."""
    text_column = "text" if "text" in raw.columns else "prompt"
    _require_values(raw, text_column, origin)
    tests = [string_list(v) for v in raw["test_list"]]
    bad = [i for i, t in enumerate(tests) if not t]
    if bad:
        raise _rows_error(
            origin,
            "`test_list` is not a non-empty list of assert strings",
            bad,
            'Give each row its asserts, e.g. ["assert f(1) == 2"].',
        )
    return pd.DataFrame(
        {
            "id": _ids(raw),
            "prompt": [mbpp_prompt(str(t), ts) for t, ts in zip(raw[text_column], tests, strict=True)],
            "answer": _text_or_empty(raw, "code"),
            "test_list": tests,
            "test_setup_code": _mbpp_setup(raw),
        }
    )


def code_io_prompt(statement: str, starter_code: str, tests: ParsedTests) -> str:
    """The problem, then how its solution runs: the starter code to complete, the function that is called, or a
    program that reads stdin and writes stdout (the cases of LiveCodeBench's prompt, in our words)."""
    fence = "Put the whole solution in one ```python code block."
    if starter_code.strip():
        return f"{statement}\n\nComplete this starter code. {fence}\n```python\n{starter_code.rstrip()}\n```\n"
    if tests.style == "call":
        return f"{statement}\n\nWrite the Python function `{tests.entry}`; its return values are checked. {fence}\n"
    return (
        f"{statement}\n\nWrite a Python program that reads the input from standard input and writes the answer to "
        f"standard output. {fence}\n"
    )


def _parsed_tests(raw: pd.DataFrame, code: CodeFormat, origin: str) -> tuple[list[ParsedTests], list[str]]:
    """Every row's tests, parsed from `code`'s own columns; a DataError names the rows without usable tests."""
    columns = [c for c in (*code.test_columns, *EXTRA_TEST_COLUMNS) if c in raw.columns]
    parsed: list[ParsedTests] = []
    bad: list[int] = []
    first_problem = ""
    for i, row in enumerate(raw[columns].to_dict("records")):
        try:
            tests = parse_tests(row)
        except TestFormatError as e:
            tests, first_problem = None, first_problem or str(e)
        if tests is None:
            bad.append(i)
            first_problem = first_problem or f"no value in {list(code.test_columns)}"
            continue
        parsed.append(tests)
    if bad:
        raise _rows_error(
            origin,
            f"the tests cannot be used (first problem: {first_problem})",
            bad,
            "Fix or remove those rows; a benchmark scored on fewer problems is not that benchmark.",
        )
    return parsed, columns


def _reference_solutions(raw: pd.DataFrame, code: CodeFormat) -> list[str]:
    """Each row's published reference solution (`code.solutions_column`), or "" where there is none."""
    column = code.solutions_column
    if column is None or column not in raw.columns:
        return [""] * len(raw)
    if code.first_solution is None:  # the column holds one program, as text
        return _text_or_empty(raw, column)
    return [code.first_solution(v) for v in raw[column]]


def map_code_io(code: CodeFormat, raw: pd.DataFrame, origin: str) -> pd.DataFrame:
    """A stdin/stdout or call-based code format (`code`, rewards/code_formats/): its statement (+ `starter_code`) ->
    prompt, its id column -> id, its reference solution -> answer, its test columns kept as JSON text."""
    statement = next(c for c in code.statement_columns if c in raw.columns)
    _require_values(raw, statement, origin)
    parsed, test_columns = _parsed_tests(raw, code, origin)
    starters = _text_or_empty(raw, "starter_code")
    prompts = [
        code_io_prompt(str(s), starter, tests)
        for s, starter, tests in zip(raw[statement], starters, parsed, strict=True)
    ]
    out = pd.DataFrame({"id": _ids(raw, code.id_column), "prompt": prompts, "answer": _reference_solutions(raw, code)})
    for column in test_columns:
        out[column] = [json_text(v) for v in raw[column]]
    return out
