"""Code execution against unit tests, in the sandbox (rewards/sandbox/).

Test styles, chosen per row from the dataset columns (docs/rewards.md has a table with a row of each):
  - HumanEval (Chen et al. 2021, github.com/openai/human-eval): `test` holds `def check(candidate): assert ...` and
    `entry_point` names the function; the program is `prompt + completion` (a continuation), or the completion's
    own code when it defines the entry point itself (chat models).
  - MBPP (Austin et al. 2021): `test_list` (or `test` as a list) holds assert statements, e.g.
    `assert remove_Occ("hello","l") == "heo"`; optional `test_setup_code` runs after the program, in its process.
  - stdin/stdout and call-based tests of APPS/TACO, CodeContests, LiveCodeBench and open-r1, parsed by
    rewards/code_formats/: each stdin case runs the program afresh (as `python prog.py`, shutdown included) and its
    stdout is compared as that dataset's own checker compares; call-based cases call its entry point.

Scores are 1/0 (`mode="pass"`: every test passed) or the passed fraction (`mode="fraction"`); a HumanEval unit is one
top-level statement of `check` that contains an assert, an MBPP unit one assert string. Rows without tests get None.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from grpo_pipeline.rewards.code_asserts import builtins_under_test, mark_under_test
from grpo_pipeline.rewards.code_formats import (
    TEST_FORMAT_COLUMNS,
    ParsedTests,
    StdioCase,
    StdoutRule,
    TestFormatError,
    entry_expression,
    parse_tests,
)
from grpo_pipeline.rewards.harness import wire
from grpo_pipeline.rewards.registry import RewardError, RewardFn, register
from grpo_pipeline.rewards.sandbox import (
    CodeJob,
    Isolation,
    RunResult,
    SandboxConfig,
    SandboxUnavailable,
    default_sandbox,
)
from grpo_pipeline.tasks.core import python_ast
from grpo_pipeline.tasks.core.chat import completion_text
from grpo_pipeline.tasks.core.values import is_blank

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


# the row columns `build_job` reads
TEST_COLUMNS = ("test", "entry_point", "test_list", "test_setup_code", *TEST_FORMAT_COLUMNS)


@dataclass(frozen=True)
class IoLimits:
    """How stdin/stdout cases run: a wall clock per case (the row's limit is the sandbox's `timeout_s`), the
    stdout kept per case, and an optional tolerance for numbers (absolute, or relative above 1)."""

    case_timeout_s: float = 2.0
    max_output_bytes: int = 1 << 20
    float_tolerance: float | None = None


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
        python_ast.parse(source)
        return True
    except (SyntaxError, ValueError):
        return False


def defines_function(source: str, name: str) -> bool:
    """Whether `source` defines `name` (a function, or the class of an entry point such as `Solution().twoSum`)."""
    root = re.match(r"\s*([A-Za-z_]\w*)", name)
    if root is None:
        return False
    pattern = rf"^\s*(?:(?:async\s+)?def|class)\s+{re.escape(root.group(1))}\s*[(:]"
    return re.search(pattern, source, re.MULTILINE) is not None


@functools.lru_cache(maxsize=4096)
def instrument_check(test: str) -> tuple[str, int]:
    """Wrap each top-level statement of `check` that contains an assert so the harness counts it as one unit.

    Returns the rewritten test source and the number of units. Statement `i` becomes
    `try: <stmt> except Exception as e: _grpo_units_.fail(i, e) else: _grpo_units_.ok(i)`.
    """
    try:
        tree = python_ast.parse(test)
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
    """Standard-library modules the assert strings use as modules (`math.isclose`), imported for them; a bare
    call such as `random(3)` is left to the program, which may define a function of that name."""
    names: set[str] = set()
    for s in statements:
        names |= {
            n.value.id
            for n in ast.walk(python_ast.parse(s))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        }
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


def asserts_job(completion: str, asserts: Sequence[str], setup: str = "", entry_point: str | None = None) -> CodeJob:
    """A sandbox job for an MBPP-style row (a list of assert statements). `entry_point`, when the row names one,
    is the function under test; a function under test named like a builtin (MBPP's `def sum(a, b)`) is the
    program's where the asserts call it, and only there (rewards/code_asserts.py)."""
    statements = tuple(str(a) for a in asserts)
    for s in statements:
        if not is_python(s):
            raise TestSpecError(f"test {s!r} does not parse")
    under_test = builtins_under_test(statements, entry_point or None)
    spec = {
        "kind": "asserts",
        "asserts": [mark_under_test(s, under_test) if under_test else s for s in statements],
        "total": len(statements),
        "imports": _stdlib_names(statements),
        "under_test": list(under_test),
    }
    # MBPP runs `test_setup_code` after the program, in its namespace: here in the program's process too, so the
    # objects it builds (`root = Node(1)`) are the program's own, and reach the asserts as handles
    program = extract_code(completion)
    return CodeJob(program=f"{program}\n\n{setup}" if setup and setup.strip() else program, spec=spec)


def stdio_job(completion: str, cases: Sequence[StdioCase], io: IoLimits, stdout_rule: StdoutRule = "lines") -> CodeJob:
    """A sandbox job for stdin/stdout tests: the program runs afresh for each case, its stdout compared with the
    expected output by `stdout_rule`, the way the tests' dataset compares (`ParsedTests.stdout_rule`; "lines":
    line by line, trailing whitespace and trailing blank lines ignored)."""
    spec = {
        "kind": "stdio",
        "cases": [(c.input, c.output) for c in cases],
        "total": len(cases),
        "case_timeout": io.case_timeout_s,
        "max_output": io.max_output_bytes,
        "float_tolerance": io.float_tolerance,
        "stdout_rule": stdout_rule,
    }
    return CodeJob(program=extract_code(completion), spec=spec)


def calls_job(completion: str, tests: ParsedTests) -> CodeJob:
    """A sandbox job for call-based tests (APPS `fn_name`, LiveCodeBench functional): each case calls the entry
    point with its arguments; the answer must equal the expected value (as the datasets' checkers compare)."""
    code = extract_code(completion)
    entry = entry_expression(tests, code)
    spec = {
        "kind": "calls",
        "entry_point": entry,
        "calls": [(list(c.args), c.expected) for c in tests.cases],
        "total": len(tests.cases),
        "unwrap": tests.unwrap_single,
    }
    return CodeJob(program=code, spec=spec)


def build_job(prompt: Any, completion: Any, row: dict[str, Any], io: IoLimits | None = None) -> CodeJob | None:
    """The job for one row, or None when the row carries no tests this reward understands."""
    test, entry_point = row.get("test"), row.get("entry_point")
    tests = row.get("test_list")
    if tests is None and isinstance(test, (list, tuple)):
        tests = test
    text = completion_text(completion)
    try:
        parsed = parse_tests(row)
    except TestFormatError as e:
        raise TestSpecError(str(e)) from None
    if parsed is not None:
        if not parsed.cases:
            raise TestSpecError(f"the row's {parsed.source} tests have no cases")
        if parsed.style == "stdio":
            return stdio_job(text, parsed.cases, io or IoLimits(), parsed.stdout_rule)
        return calls_job(text, parsed)
    if tests is not None and len(tests) > 0:
        named = None if is_blank(entry_point) else str(entry_point)
        return asserts_job(text, tests, row.get("test_setup_code") or "", named)
    if isinstance(test, str) and test.strip() and entry_point:
        return humaneval_job(prompt_text(prompt), text, test, str(entry_point))
    return None


def job_key(spec: dict[str, Any]) -> object:
    """What the sandbox receives of a job's tests (the harness's own encoding), so two jobs share a key only when
    the sandbox cannot tell them apart: it keeps sets, bytes, tuples and int keys apart, which JSON cannot hold or
    would merge (`(1, 2)` and `[1, 2]`). A spec that cannot be encoded gets a key of its own (its row runs alone,
    and the sandbox reports on that row only)."""
    try:
        return wire.encode(spec)
    except Exception:
        return object()


def run_rows(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    columns: dict[str, Sequence[Any]],
    config: SandboxConfig,
    io: IoLimits | None = None,
) -> tuple[list[RunResult | None], list[str | None]]:
    """Sandbox results for every row, and for each row without one (None) the reason: the row has no tests, its
    tests are broken, or the sandbox failed to run the program twice (an infrastructure error, never the program's
    fault, so it is retried once)."""
    jobs: list[CodeJob] = []
    where: list[int] = []
    reasons: list[str | None] = [None] * len(completions)
    # Only the columns the tests live in: TRL also passes objects that are not per-row (`trainer_state`,
    # `log_extra`, `log_metric`) and extra dataset columns this reward does not read.
    columns = {k: v for k, v in columns.items() if k in TEST_COLUMNS and v is not None}
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        row = {k: v[i] for k, v in columns.items()}
        try:
            job = build_job(p, c, row, io)
        except TestSpecError as e:
            logger.error("row %d: %s; scoring it None", i, e)
            reasons[i] = f"tests cannot run: {e}"
            continue
        if job is None:
            reasons[i] = f"no tests: the row has none of the columns {', '.join(TEST_COLUMNS)}"
        else:
            jobs.append(job)
            where.append(i)
    # A GRPO group often holds the same program several times (a sharpened policy samples its favourite body again
    # and again): each distinct program runs once per call and its verdict is shared, which is the same verdict a
    # second run would give for a deterministic program and saves most of the sandbox's time on short completions.
    unique: dict[tuple[str, object], int] = {}
    slot = [unique.setdefault((j.program, job_key(j.spec)), len(unique)) for j in jobs]
    distinct = [jobs[slot.index(u)] for u in range(len(unique))]
    sandbox = default_sandbox(config)
    ran = sandbox.run(distinct)
    again = [u for u, r in enumerate(ran) if r.infra_error]
    if again:
        logger.warning(
            "code_tests: the sandbox failed to run %d of %d programs; running them again", len(again), len(ran)
        )
        for u, r in zip(again, sandbox.run([distinct[u] for u in again]), strict=True):
            ran[u] = r
    results: list[RunResult | None] = [None] * len(completions)
    for i, u in zip(where, slot, strict=True):
        results[i] = ran[u]
        if ran[u].infra_error:
            reasons[i] = f"sandbox error: {ran[u].detail}"
    infra = sum(1 for r in results if r is not None and r.infra_error)
    if infra:
        logger.warning("code_tests: %d of %d programs hit infrastructure errors twice (scored None)", infra, len(jobs))
    return results, reasons


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
    case_timeout_s: float = 2.0,
    float_tolerance: float | None = None,
) -> RewardFn:
    """Run each completion against its row's unit tests in the sandbox: 1/0 all passed, or the passed fraction.

    Columns: HumanEval style `test` + `entry_point` (program = prompt + completion, or the completion's own code
    block when it defines the function), MBPP style `test_list` (+ optional `test_setup_code`), or the
    stdin/stdout and call-based formats of rewards/code_formats/ (APPS/TACO `input_output`, CodeContests
    `public_tests`/`private_tests`/`generated_tests`, LiveCodeBench `public_test_cases`/`private_test_cases`,
    open-r1 `verification_info`). `timeout_s` bounds a whole row; `case_timeout_s` one stdin/stdout case;
    `float_tolerance` lets numbers in stdout differ by that much (absolute, or relative above 1).
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

    io = IoLimits(case_timeout_s=case_timeout_s, max_output_bytes=max_output_bytes, float_tolerance=float_tolerance)

    def code_tests(prompts, completions, **columns) -> list[float | None]:
        results, reasons = run_rows(prompts, completions, columns, config, io)
        code_tests.none_reasons[:] = reasons  # why each None is None (`grpo-pipeline rewards score` prints them);
        # changed in place, so that wrappers made with functools.update_wrapper share the list
        return [None if r is None else r.score(mode) for r in results]

    code_tests.none_reasons = []

    return code_tests
