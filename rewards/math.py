"""Answer correctness for tasks with a final answer (arithmetic, GSM8K-style word problems, competition math).

Equivalence is decided by math-verify (github.com/huggingface/Math-Verify): `verify(gold, prediction)`, gold first
(the comparison is not symmetric). Gold answers are taken after GSM8K's `#### N`, from `\\boxed{...}`, or whole;
predictions from `<answer>...</answer>` when present, else math-verify's own extraction (boxed first).

math-verify bounds its work with `signal.alarm`, which only works in the main thread (Prefect runs tasks and TRL
may run rewards in threads). So: in the main thread its own timeouts are used; elsewhere the batch goes to a
worker process, whose main thread can use them, with a wall-clock bound on our side. A timeout or an internal
error is logged and scored None, never a silent 0. Plain numbers on both sides (the tiny arithmetic recipe, most
GSM8K completions) are compared exactly without math-verify, which keeps thousands of calls per step cheap.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from fractions import Fraction

from grpo_pipeline.rewards.registry import RewardFn, completion_text, register

logger = logging.getLogger(__name__)

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_HASHES = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
_PLAIN_NUMBER = re.compile(r"\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)\s*\$?\s*\.?\s*")


def extract_gold(answer: str) -> str:
    """The reference answer: the text after GSM8K's `#### ` (commas dropped), the last `\\boxed{}`, or all of it."""
    text = str(answer).strip()
    found = _HASHES.search(text)
    if found:
        return found.group(1).replace(",", "").strip()
    boxed = last_boxed(text)
    return boxed if boxed is not None else text


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
    try:
        # each pair may use up to two parses and one verify, each bounded by timeout_s in the worker
        return future.result(timeout=30 + 3 * timeout_s * len(pairs))
    except FutureTimeout:
        logger.error("math-verify worker did not answer in time; scoring %d completions None", len(pairs))
        _reset_pool()
    except Exception:
        logger.exception("math-verify worker failed; scoring %d completions None", len(pairs))
        _reset_pool()
    return [None] * len(pairs)


def math_scores(completions: list[str], golds: list[str], timeout_s: int = 5) -> list[float | None]:
    """1.0 / 0.0 for each completion against its gold answer (None when it cannot be decided)."""
    scores: list[float | None] = [None] * len(completions)
    slow: list[int] = []
    for i, (text, gold_raw) in enumerate(zip(completions, golds, strict=True)):
        if gold_raw is None or not str(gold_raw).strip():
            continue  # no reference: not applicable
        gold = extract_gold(str(gold_raw))
        pred = prediction_text(text)
        g, p = _plain_number(gold), _plain_number(pred)
        if g is not None and p is not None:
            scores[i] = 1.0 if g == p else 0.0
        elif not pred.strip():
            scores[i] = 0.0
        else:
            slow.append(i)
    if slow:
        verdicts = verify_batch(
            [(extract_gold(str(golds[i])), prediction_text(completions[i])) for i in slow], timeout_s
        )
        for i, v in zip(slow, verdicts, strict=True):
            scores[i] = None if v is None else float(v)
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


_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


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
