"""Answer correctness for tasks with a final answer (arithmetic, GSM8K-style word problems, competition math).

Equivalence is decided by math-verify (github.com/huggingface/Math-Verify): `verify(gold, prediction)`, gold first
(the comparison is not symmetric). Gold answers are taken after GSM8K's `#### N`, from `\\boxed{...}`, or whole;
predictions from `<answer>...</answer>` when present, else math-verify's own extraction (boxed first).

math-verify bounds its work with `signal.alarm`, which only works in the main thread (Prefect runs tasks and TRL
may run rewards in threads). So: in the main thread its own timeouts are used; elsewhere the batch goes to a
worker process, whose main thread can use them, with a wall-clock bound on our side. A timeout or an internal
error is logged and scored None, never a silent 0. Plain numbers on both sides (the tiny arithmetic recipe, most
GSM8K completions) are compared exactly without math-verify, which keeps thousands of calls per step cheap.

Commas. A comma is a thousands separator only where the number is written that way: a first group of 1-3 digits,
then groups of exactly 3 (`1,234`, `12,345,678`). Anything else with commas outside brackets is a list (`2,3`,
`x=1, y=2`). When the reference is such a list and the answer is one too (in `\\boxed{}`, in `<answer>`, or a bare
list of numbers), they are compared item by item, in order: math-verify would read `2,3` as the set {2, 3} (so
`3,2` would match) or, unboxed, as the decimal 2.3. A reference written as a set (`\\{2,3\\}`) or in brackets
(`(2,3)`, an interval or a tuple) is left to math-verify, which compares sets without order. A list answer to a
plain-number reference is wrong (`\\boxed{2,3}` is not 23, nor 2.3).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import re
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from fractions import Fraction

from grpo_pipeline.rewards.registry import RewardFn, call_deadline, register
from grpo_pipeline.tasks.core.chat import completion_text

logger = logging.getLogger(__name__)

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_HASHES = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
# A number as written: thousands separators only in groups of exactly 3 after a first group of 1-3 digits
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_PLAIN_NUMBER = re.compile(rf"\s*\$?\s*({_NUMBER})\s*\$?\s*\.?\s*")


def extract_gold(answer: str) -> str:
    """The reference answer: the text after GSM8K's `#### ` (thousands separators dropped), the last `\\boxed{}`,
    or all of it."""
    text = str(answer).strip()
    found = _HASHES.search(text)
    if found:
        gold = found.group(1).strip()
        return gold.replace(",", "") if _plain_number(gold) is not None else gold
    boxed = last_boxed(text)
    return boxed if boxed is not None else text


def split_list(text: str) -> list[str] | None:
    """The items of a bare comma-separated list (`2,3`, `2, 3`, `x=1, y=\\frac{1}{2}`), split at the commas outside
    brackets and braces; None when `text` is one value: a number with thousands separators (`1,234`), a set, tuple
    or interval in brackets (`\\{2,3\\}`, `(2,3)`), or anything without a comma outside brackets."""
    body = text.strip().removesuffix(".").strip().strip("$").strip().removesuffix(".").strip()  # "$2, 3$." -> "2, 3"
    if not body or _plain_number(body) is not None:
        return None
    items, depth, start = [], 0, 0
    for i, char in enumerate(body):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    items.append(body[start:].strip())
    return items if len(items) > 1 and all(items) else None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def prediction_text(completion: str) -> str:
    """Where the answer is looked for: the last `<answer>` block when there is one, else the whole completion."""
    found = _ANSWER_TAG.findall(completion)
    return found[-1] if found else completion


def _plain_number(text: str) -> Fraction | None:
    match = _PLAIN_NUMBER.fullmatch(text)
    if match is None:
        return None
    try:
        return Fraction(match.group(1).replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _verify_here(pairs: list[tuple[str, str]], timeout_s: int) -> list[bool | None]:
    """math-verify on (gold, prediction) pairs in this thread; must be a main thread when timeout_s > 0."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    from math_verify.errors import TimeoutException

    out: list[bool | None] = []
    for gold, pred in pairs:
        try:
            gold_parsed = parse(f"${gold}$", parsing_timeout=timeout_s, raise_on_error=True)
            if not gold_parsed:
                gold_parsed = parse(gold, parsing_timeout=timeout_s, raise_on_error=True)
            if not gold_parsed:
                logger.error("math-verify could not parse the gold answer %r; scoring None", gold[:200])
                out.append(None)
                continue
            pred_parsed = parse(
                pred,
                extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
                parsing_timeout=timeout_s,
                raise_on_error=True,
            )
            out.append(
                bool(pred_parsed) and verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s, raise_on_error=True)
            )
        except TimeoutException:
            logger.warning("math-verify timed out (%ss) on gold %r; scoring None", timeout_s, gold[:100])
            out.append(None)
        except Exception:
            logger.exception("math-verify failed on gold %r; scoring None", gold[:100])
            out.append(None)
    return out


_POOL: ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ProcessPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            # spawn: forking a process that runs threads is unsafe; the worker's main thread can use signal.alarm
            _POOL = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
            atexit.register(_POOL.shutdown, wait=False, cancel_futures=True)
        return _POOL


def _reset_pool() -> None:
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            for proc in list(getattr(_POOL, "_processes", {}).values()):
                proc.kill()
            _POOL.shutdown(wait=False, cancel_futures=True)
            _POOL = None


def verify_batch(pairs: list[tuple[str, str]], timeout_s: int = 5) -> list[bool | None]:
    """Equivalence of each (gold, prediction) pair with math-verify, safe in any thread (see module docstring)."""
    if not pairs:
        return []
    if threading.current_thread() is threading.main_thread():
        return _verify_here(pairs, timeout_s)
    future = _pool().submit(_verify_here, pairs, timeout_s)
    # each pair may use up to two parses and one verify, each bounded by timeout_s in the worker; and no longer than
    # the reward call may take (the registry's limit), past which the result would be thrown away
    wait, deadline = 30 + 3 * timeout_s * len(pairs), call_deadline()
    late = deadline is not None and deadline - time.monotonic() < wait
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()) if late else wait)
    except FutureTimeout:
        # past the call's limit the registry has warned once already
        logger.log(
            logging.DEBUG if late else logging.ERROR,
            "math-verify worker did not answer in time; scoring %d completions None",
            len(pairs),
        )
        _reset_pool()
    except Exception:
        logger.exception("math-verify worker failed; scoring %d completions None", len(pairs))
        _reset_pool()
    return [None] * len(pairs)


# What decides one completion: booleans decided here, (gold, prediction) pairs left to math-verify; right when all hold
Check = bool | tuple[str, str]


def _answer_list(completion: str, pred: str) -> list[str] | None:
    """The completion's answer as a list, when it gives one: in its last `\\boxed{}`, in its `<answer>` block, or as
    the whole completion when that is a bare list of numbers (prose with commas is not a list)."""
    boxed = last_boxed(pred)
    if boxed is not None:
        return split_list(boxed)
    items = split_list(pred)
    if items is None or _ANSWER_TAG.search(completion):
        return items
    return items if all(_plain_number(item) is not None for item in items) else None


def _item_check(gold: str, pred: str) -> Check:
    g, p = _plain_number(gold), _plain_number(pred)
    return g == p if g is not None and p is not None else (gold, f"\\boxed{{{pred}}}")


def _checks(gold: str, completion: str) -> list[Check]:
    pred = prediction_text(completion)
    gold_items, pred_items = split_list(gold), _answer_list(completion, pred)
    if gold_items is not None and pred_items is not None:  # lists: item by item, in order
        if len(gold_items) != len(pred_items):
            return [False]
        return [_item_check(g, p) for g, p in zip(gold_items, pred_items, strict=True)]
    g, p = _plain_number(gold), _plain_number(pred)
    if g is not None and p is not None:
        return [g == p]
    if g is not None and pred_items is not None:  # a list for a number: `2,3` is neither 23 nor 2.3
        return [False]
    if not pred.strip():
        return [False]
    return [(gold, pred)]


def math_scores(completions: list[str], golds: list[str], timeout_s: int = 5) -> list[float | None]:
    """1.0 / 0.0 for each completion against its gold answer (None when it cannot be decided)."""
    checks: list[list[Check] | None] = [
        None if gold is None or not str(gold).strip() else _checks(extract_gold(str(gold)), text)  # None: no reference
        for text, gold in zip(completions, golds, strict=True)
    ]
    pairs = [c for row in checks if row for c in row if isinstance(c, tuple)]
    verdicts = iter(verify_batch(pairs, timeout_s))
    scores: list[float | None] = []
    for row in checks:
        if row is None:
            scores.append(None)
            continue
        results = [next(verdicts) if isinstance(c, tuple) else c for c in row]
        if any(r is not None and not r for r in results):
            scores.append(0.0)
        else:
            scores.append(None if None in results else 1.0)
    return scores


@register("correctness")
def correctness_reward(timeout_s: int = 5) -> RewardFn:
    """1.0 when the completion's final answer is equivalent to the `answer` column (math-verify), else 0.0.

    `answer` may be a bare value ("46"), a GSM8K solution ending in `#### 46`, or contain `\\boxed{46}`.
    """

    def correctness(prompts, completions, answer=None, **kwargs) -> list[float | None]:
        if answer is None:  # no reference answers: not applicable
            return [None] * len(completions)
        return math_scores([completion_text(c) for c in completions], list(answer), timeout_s)

    return correctness


_LAST_NUMBER = re.compile(_NUMBER)


def answer_key(completion: str) -> str | None:
    """A canonical form of a completion's final answer, for majority voting (maj@k): the last `\\boxed{}` (its
    text without spaces, or its number), else the last number (as an exact fraction, so `18`, `18.0` and `18.00`
    vote together), else the text with runs of spaces collapsed; None when the completion is empty."""
    pred = prediction_text(completion)
    boxed = last_boxed(pred)
    if boxed is not None:
        number = _plain_number(boxed)
        return str(number) if number is not None else "".join(boxed.split()) or None
    numbers = _LAST_NUMBER.findall(pred)
    if numbers:
        with contextlib.suppress(ValueError, ZeroDivisionError):
            return str(Fraction(numbers[-1].replace(",", "")))
    return " ".join(pred.split()) or None


# The end of a tool result in the plain-text call syntax of agents/text_tools.py (GSM8K's calculator annotations,
# `<<48+24=72>>`): the rollout loop writes it after the result, so what follows the last one is the model's answer.
TOOL_RESULT_END = ">>"


def after_tool_results(text: str) -> str:
    """The text after the last tool result (`>>`), or all of it when the episode called no tool: the episode's final
    answer, which alone is scored (a result the tool wrote is not the model's answer)."""
    return text.rpartition(TOOL_RESULT_END)[2] if TOOL_RESULT_END in text else text


@register("final_answer")
def final_answer_reward(timeout_s: int = 5) -> RewardFn:
    """`correctness` of the episode's final answer only: the text after the last tool result (`after_tool_results`),
    so a policy is rewarded for the answer it writes, never for a tool call as such (docs/agents.md)."""

    def final_answer(prompts, completions, answer=None, **kwargs) -> list[float | None]:
        if answer is None:  # no reference answers: not applicable
            return [None] * len(completions)
        finals = [after_tool_results(completion_text(c)) for c in completions]
        return math_scores(finals, list(answer), timeout_s)

    return final_answer
