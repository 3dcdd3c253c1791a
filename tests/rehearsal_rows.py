"""Small local stand-ins, in the published columns, for the hub datasets the GPU recipes read where ../shared/data has
no copy: GSM8K's train split, open-r1's verifiable coding problems and EvalPlus's MBPP. Each row is a problem written
here from a template, with its reference answer or solution and tests computed from the same numbers, so every
reference passes its own tests (tests/test_rehearse.py checks it in the sandbox). They feed rehearsals
(`grpo-pipeline rehearse`), which only need rows of the right shape; they are no benchmark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------- GSM8K (openai/gsm8k: question, answer)


def _name(i: int) -> str:
    """A name of its own for each of the first 64 rows."""
    return ("Ma", "Lo", "Ti", "Re", "Sa", "No", "Ka", "Di")[i % 8] + (
        "ria",
        "ven",
        "lo",
        "nia",
        "mon",
        "ra",
        "dan",
        "bel",
    )[i // 8]


def gsm8k_rows(n: int = 60) -> list[dict[str, str]]:
    """Grade-school word problems whose answer ends with `#### <number>`, as GSM8K's do. Each names its own person in
    every sentence, so that no two rows share a run of 13 words (decontamination would take them for copies)."""
    rows = []
    for i in range(n):
        a, b, c, name = 3 + i, 2 + i % 7, 1 + i % 5, _name(i)
        if i % 3 == 0:
            question = (
                f"{name} has {a} boxes with {b} pencils in each box. {name} gives {c} pencils to a friend. "
                f"How many pencils does {name} have left?"
            )
            work, result = f"{name} has {a} * {b} = <<{a}*{b}={a * b}>>{a * b} pencils.", a * b - c
            work += f"\nAfter giving {c} away there are {a * b} - {c} = <<{a * b}-{c}={result}>>{result} left."
        elif i % 3 == 1:
            question = (
                f"{name} bakes {a} loaves of bread a day for {b} days. {name} keeps {c} loaves. "
                f"How many loaves does {name} sell?"
            )
            work, result = f"{name} bakes {a} * {b} = <<{a}*{b}={a * b}>>{a * b} loaves.", a * b - c
            work += f"\n{name} sells {a * b} - {c} = <<{a * b}-{c}={result}>>{result} loaves."
        else:
            question = (
                f"{name} drives at {a} kilometres an hour for {b} hours. Then {name} drives {c} kilometres more. "
                f"How far does {name} drive in all?"
            )
            work, result = f"In {b} hours {name} drives {a} * {b} = <<{a}*{b}={a * b}>>{a * b} km.", a * b + c
            work += f"\nIn all {name} drives {a * b} + {c} = <<{a * b}+{c}={result}>>{result} km."
        rows.append({"question": question, "answer": f"{work}\n#### {result}"})
    return rows


# ----------------------------------------------------------------------------- open-r1 verifiable coding problems


def _stdin_problem(k: int, family: int) -> tuple[str, str, list[tuple[str, str]]]:
    """(statement, solution, [(stdin, stdout)]) of one stdin/stdout problem. Statements are shorter than 13 words,
    so that rows that differ only in k do not share a 13-word run (decontamination would take them for copies)."""
    if family == 0:
        statement = f"Read an integer n and print n times {k}."
        solution = f"n = int(input())\nprint(n * {k})\n"
        cases = [(f"{n}\n", f"{n * k}\n") for n in (0, 7, -12)]
    elif family == 1:
        statement = f"Read m, then m integers; print how many of them divide by {k}."
        solution = f"input()\nprint(sum(1 for x in map(int, input().split()) if x % {k} == 0))\n"
        lists = ([1, 2, 3, 4, 5, 6], [k, 2 * k, k + 1], [0, -k, 7 * k, 1])
        cases = [(f"{len(xs)}\n{' '.join(map(str, xs))}\n", f"{sum(1 for x in xs if x % k == 0)}\n") for xs in lists]
    else:
        statement = f"Print the input line with each letter written {k} times."
        solution = f"print(''.join(c * {k} for c in input().strip()))\n"
        cases = [(f"{word}\n", "".join(c * k for c in word) + "\n") for word in ("abc", "z", "hello")]
    return statement, solution, cases


def open_r1_rows(n: int = 60) -> list[dict[str, Any]]:
    """Rows in open-r1/verifiable-coding-problems-python's columns: stdin/stdout problems and, every fourth row, a
    function to write (test type function_call)."""
    rows = []
    for i in range(n):
        k, family = 2 + i // 4, i % 4
        if family < 3:
            statement, solution, io = _stdin_problem(k, family)
            cases = [{"type": "stdin_stdout", "input": stdin, "output": out, "fn_name": None} for stdin, out in io]
        else:
            statement = f"Write clip_at(xs), returning xs with each element above {k} set to {k}."
            solution = f"def clip_at(xs):\n    return [min(x, {k}) for x in xs]\n"
            calls = ([1, 50, k], [], [k + 1, -3])
            cases = [
                {"type": "function_call", "input": json.dumps([xs]), "output": json.dumps([min(x, k) for x in xs]),
                 "fn_name": "clip_at"}
                for xs in calls
            ]  # fmt: skip
        rows.append(
            {
                "source": "rehearsal",
                "task_type": "verifiable_code",
                "in_source_id": f"rehearsal-{i}",
                "problem_statement": statement,
                "gold_standard_solution": f"```python\n{solution}```",
                "problem_id": f"rehearsal_{i}",
                "metadata": {"difficulty": "easy", "time_limit": "1 second"},
                "verification_info": {"language": "python", "test_cases": cases},
            }
        )
    return rows


# ----------------------------------------------------------------------------- MBPP (evalplus/mbppplus)


def mbpp_rows(n: int = 16) -> list[dict[str, Any]]:
    """Rows in evalplus/mbppplus's columns (its EvalPlus `test` harness aside): the prompt is the task and one of its
    asserts in a docstring, as EvalPlus writes it; test_list holds three asserts."""
    rows = []
    for i in range(n):
        k = 2 + i // 2
        if i % 2 == 0:
            text = f"Write a function to multiply every element of a list by {k}."
            code = f"def scale_list(xs):\n    return [x * {k} for x in xs]\n"
            tests = [f"assert scale_list({xs}) == {[x * k for x in xs]}" for xs in ([1, 2, 3], [], [-4, 0])]
        else:
            text = f"Write a python function to count the words of a sentence that are longer than {k} letters."
            code = f"def count_long_words(s):\n    return sum(1 for w in s.split() if len(w) > {k})\n"
            sentences = ("the quick brown fox jumps", "a bb ccc dddd eeeee ffffff", "")
            tests = [f"assert count_long_words({s!r}) == {sum(1 for w in s.split() if len(w) > k)}" for s in sentences]
        rows.append(
            {
                "task_id": 900 + i,
                "code": code,
                "prompt": f'"""\n{text}\n{tests[0]}\n"""\n',
                "source_file": "rehearsal",
                "test_imports": [],
                "test_list": tests,
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
