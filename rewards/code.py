"""Code execution against unit tests, in the sandbox (rewards/sandbox.py).

Two test styles, chosen per row from the dataset columns:
  - HumanEval (Chen et al. 2021, github.com/openai/human-eval): `test` holds `def check(candidate): assert ...` and
    `entry_point` names the function; the program is `prompt + completion` (a continuation), or the completion's
    own code when it defines the entry point itself (chat models).
  - MBPP (Austin et al. 2021): `test_list` (or `test` as a list) holds assert statements, e.g.
    `assert remove_Occ("hello","l") == "heo"`; optional `test_setup_code` runs first.

Scores are 1/0 (`mode="pass"`: every test passed) or the passed fraction (`mode="fraction"`); a HumanEval unit is one
top-level statement of `check` that contains an assert, an MBPP unit one assert string. Rows without tests get None.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any, Literal

from grpo_pipeline.rewards.registry import RewardError, RewardFn, completion_text, register
from grpo_pipeline.rewards.sandbox import (
    CodeJob,
    Isolation,
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
    default_sandbox,
)

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


TEST_COLUMNS = ("test", "entry_point", "test_list", "test_setup_code")  # the row columns `build_job` reads


class TestSpecError(ValueError):
    """Tests that cannot be run (a dataset problem, not the program's)."""


def extract_code(text: str) -> str:
    """The last fenced code block of a completion (```python ... ```), or the whole text when it has none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def prompt_text(prompt: Any) -> str:
    """The text of a prompt: a plain string, or the last user message of a chat prompt."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and prompt and isinstance(prompt[-1], dict):
        users = [m for m in prompt if m.get("role") == "user"] or list(prompt)
        return str(users[-1].get("content", ""))
    return "" if prompt is None else str(prompt)


@functools.lru_cache(maxsize=4096)
def is_python(source: str) -> bool:
    try:
        ast.parse(source)
        return True
    except (SyntaxError, ValueError):
        return False


def defines_function(source: str, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(", source, re.MULTILINE) is not None


@functools.lru_cache(maxsize=4096)
def instrument_check(test: str) -> tuple[str, int]:
    """Wrap each top-level statement of `check` that contains an assert so the harness counts it as one unit.

    Returns the rewritten test source and the number of units. Statement `i` becomes
    `try: <stmt> except Exception as e: _grpo_units_.fail(i, e) else: _grpo_units_.ok(i)`.
    """
    try:
        tree = ast.parse(test)
    except SyntaxError as e:
        raise TestSpecError(f"test code does not parse: {e}") from None
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise TestSpecError("test code defines no `check(candidate)` function")
    body, units = [], 0
    for stmt in check.body:
        nested_def = isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if nested_def or not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            body.append(stmt)
            continue

        def record(method: str, *extra: ast.expr, unit: int = units) -> ast.Expr:
            target = ast.Attribute(ast.Name("_grpo_units_", ast.Load()), method, ast.Load())
            return ast.Expr(ast.Call(target, [ast.Constant(unit), *extra], []))

        error = ast.Name("_grpo_error_", ast.Load())
        body.append(
            ast.Try(
                body=[stmt],
                handlers=[
                    ast.ExceptHandler(ast.Name("Exception", ast.Load()), "_grpo_error_", [record("fail", error)])
                ],
                orelse=[record("ok")],
                finalbody=[],
            )
        )
        units += 1
    check.body = body
    return ast.unparse(ast.fix_missing_locations(tree)), units


@functools.lru_cache(maxsize=4096)
def _stdlib_names(statements: tuple[str, ...]) -> list[str]:
    """Standard-library modules the assert strings use by name (e.g. `math.isclose`), imported for them."""
    names: set[str] = set()
    for s in statements:
        names |= {n.id for n in ast.walk(ast.parse(s)) if isinstance(n, ast.Name)}
    return sorted(n for n in names if n in sys.stdlib_module_names)


def humaneval_job(prompt: str, completion: str, test: str, entry_point: str) -> CodeJob:
    """A sandbox job for a HumanEval-style row."""
    code = extract_code(completion)
    setup = prompt if is_python(prompt) else ""
    if not defines_function(code, entry_point):
        program = prompt + code  # a continuation of the prompt (the HumanEval protocol)
    else:
        program = f"{setup}\n{code}" if setup else code
    test_source, units = instrument_check(test)
    spec = {"kind": "humaneval", "setup": setup, "test": test_source, "entry_point": entry_point, "total": units}
    return CodeJob(program=program, spec=spec)


def asserts_job(completion: str, asserts: Sequence[str], setup: str = "") -> CodeJob:
    """A sandbox job for an MBPP-style row (a list of assert statements)."""
    statements = tuple(str(a) for a in asserts)
    for s in statements:
        if not is_python(s):
            raise TestSpecError(f"test {s!r} does not parse")
    spec = {
        "kind": "asserts",
        "asserts": list(statements),
        "setup": setup or "",
        "total": len(statements),
        "imports": _stdlib_names(statements),
    }
    return CodeJob(program=extract_code(completion), spec=spec)


def build_job(prompt: Any, completion: Any, row: dict[str, Any]) -> CodeJob | None:
    """The job for one row, or None when the row carries no tests this reward understands."""
    test, entry_point = row.get("test"), row.get("entry_point")
    tests = row.get("test_list")
    if tests is None and isinstance(test, (list, tuple)):
        tests = test
    text = completion_text(completion)
    if tests is not None and len(tests) > 0:
        return asserts_job(text, tests, row.get("test_setup_code") or "")
    if isinstance(test, str) and test.strip() and entry_point:
        return humaneval_job(prompt_text(prompt), text, test, str(entry_point))
    return None


def run_rows(
    prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Sequence[Any]], config: SandboxConfig
) -> list[RunResult | None]:
    """Sandbox results for every row (None where the row has no tests or its tests are broken)."""
    jobs: list[CodeJob] = []
    where: list[int] = []
    # Only the columns the tests live in: TRL also passes objects that are not per-row (`trainer_state`,
    # `log_extra`, `log_metric`) and extra dataset columns this reward does not read.
    columns = {k: v for k, v in columns.items() if k in TEST_COLUMNS and v is not None}
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        row = {k: v[i] for k, v in columns.items()}
        try:
            job = build_job(p, c, row)
        except TestSpecError as e:
            logger.error("row %d: %s; scoring it None", i, e)
            continue
        if job is not None:
            jobs.append(job)
            where.append(i)
    # A GRPO group often holds the same program several times (a sharpened policy samples its favourite body again
    # and again): each distinct program runs once per call and its verdict is shared, which is the same verdict a
    # second run would give for a deterministic program and saves most of the sandbox's time on short completions.
    unique: dict[tuple[str, str], int] = {}
    slot = [unique.setdefault((j.program, json.dumps(j.spec, sort_keys=True)), len(unique)) for j in jobs]
    distinct = [jobs[slot.index(u)] for u in range(len(unique))]
    ran = default_sandbox(config).run(distinct)
    results: list[RunResult | None] = [None] * len(completions)
    for i, u in zip(where, slot, strict=True):
        results[i] = ran[u]
    infra = sum(1 for r in results if r is not None and r.infra_error)
    if infra:
        logger.warning("code_tests: %d of %d programs hit infrastructure errors (scored None)", infra, len(jobs))
    return results


@register("code_tests")
def code_tests_reward(
    mode: Literal["pass", "fraction"] = "pass",
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    workers: int | None = None,
    isolation: Isolation = "auto",
    python: str | None = None,
    extra_ro_paths: Sequence[str] = (),
) -> RewardFn:
    """Run each completion against its row's unit tests in the sandbox: 1/0 all passed, or the passed fraction.

    Columns: HumanEval style `test` + `entry_point` (program = prompt + completion, or the completion's own code
    block when it defines the function), or MBPP style `test_list` (+ optional `test_setup_code`).
    """
    if mode not in ("pass", "fraction"):
        raise ValueError(f"mode must be 'pass' or 'fraction', got {mode!r}")
    try:
        config = SandboxConfig(
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_output_bytes=max_output_bytes,
            workers=workers,
            isolation=isolation,
            python=python,
            extra_ro_paths=tuple(extra_ro_paths),
        )
        default_sandbox(config)  # a sandbox that refuses to run here says so once, now, not on every batch
    except (SandboxUnavailable, ValueError) as e:
        raise RewardError(f"reward 'code_tests': {e}") from None

    def code_tests(prompts, completions, **columns) -> list[float | None]:
        results = run_rows(prompts, completions, columns, config)
        return [None if r is None else r.score(mode) for r in results]

    return code_tests
