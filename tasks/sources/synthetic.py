"""The built-in synthetic tasks, deterministic by seed: two-digit arithmetic (with an imperfect teacher that forgets
carries) and Python functions from examples with hidden unit tests (with a teacher that swaps operands)."""

from __future__ import annotations

import operator
import random
import re
from typing import Any

import pandas as pd

from grpo_pipeline.configs.schema import SyntheticTaskConfig
from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.sources import DataError

# ----------------------------------------------------------------------------- synthetic arithmetic

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _operand(rng: random.Random, cfg: SyntheticTaskConfig) -> int:
    digits = rng.randint(cfg.min_digits, cfg.max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def synthetic_arithmetic(cfg: SyntheticTaskConfig, n: int, seed: int) -> pd.DataFrame:
    """`n` distinct problems like `prompt="47+8="`, `answer="55"`, drawn deterministically from `seed`."""
    largest = 10**cfg.max_digits
    space = (largest - (0 if cfg.min_digits == 1 else 10 ** (cfg.min_digits - 1))) ** 2 * len(cfg.operations)
    if n > space * 0.7:
        raise DataError(
            f"asked for {n} distinct problems but only about {space} exist with max_digits={cfg.max_digits}; "
            "lower data.num_train/num_eval/num_probe or raise data.synthetic.max_digits"
        )
    rng = random.Random(seed)
    seen: dict[str, str] = {}
    while len(seen) < n:
        a, b, op = _operand(rng, cfg), _operand(rng, cfg), rng.choice(cfg.operations)
        prompt = f"{a}{op}{b}="
        if prompt not in seen:
            seen[prompt] = str(_OPS[op](a, b))
    return pd.DataFrame({"prompt": list(seen), "answer": list(seen.values())})


_ADDITION = re.compile(r"(\d+)\+(\d+)=")


def needs_carry(prompt: str) -> bool | None:
    """Whether a synthetic '+' problem carries out of the units digit; None for any other problem."""
    m = _ADDITION.search(prompt)
    if m is None:
        return None
    return int(m.group(1)) % 10 + int(m.group(2)) % 10 >= 10


def carry_free_sum(a: int, b: int) -> int:
    """`a + b` added column by column with every carry forgotten: each digit is its column's sum mod 10
    (75+48 -> 13, 51+50 -> 1)."""
    total, place = 0, 1
    while a or b:
        total += (a % 10 + b % 10) % 10 * place
        a, b, place = a // 10, b // 10, place * 10
    return total


def slip_carries(train: pd.DataFrame, rate: float, seed: int, carries: str = "units") -> pd.DataFrame:
    """An imperfect teacher's SFT targets: on a `rate` fraction of the '+' problems that need a carry, the
    completion forgets it. `carries="units"`: the carry out of the units digit (47+38 -> 75, the answer minus 10);
    `"all"`: every carry, the hundreds' included (75+48 -> 13), on the problems that need any. `answer` stays right,
    so rewards and evaluation are unaffected."""
    if rate <= 0:
        return train
    rng = random.Random(f"teacher-slip-{seed}")

    def slipped(prompt: str, answer: str, completion: str) -> str:
        if carries == "units":
            return str(int(answer) - 10) if needs_carry(prompt) and rng.random() < rate else completion
        m = _ADDITION.search(prompt)
        if m is None:  # not an addition
            return completion
        forgetful = carry_free_sum(int(m.group(1)), int(m.group(2)))
        return str(forgetful) if str(forgetful) != answer and rng.random() < rate else completion

    new = [slipped(*row) for row in zip(train["prompt"], train["answer"], train["completion"], strict=True)]
    changed = sum(n != old for n, old in zip(new, train["completion"], strict=True))
    logger.info("imperfect teacher: %d of %d SFT completions forget a carry", changed, len(train))
    return train.assign(completion=new)


def units_drill(width: int, copies: int) -> pd.DataFrame:
    """`copies` of the 100 one-digit additions with operands zero-padded to `width` digits (`07+08=` -> `15`): the
    units-digit table at the positions a real problem's units digits take, for SFT only (data.synthetic.units_drill).
    The answer is written as a real one is (no padding), so the drill's targets never teach a format GRPO's
    rewards would not accept."""
    rows = [(f"{a:0{width}d}+{b:0{width}d}=", str(a + b)) for a in range(10) for b in range(10)] * copies
    return pd.DataFrame(
        {"prompt": [p for p, _ in rows], "answer": [a for _, a in rows], "completion": [a for _, a in rows]}
    )


# ----------------------------------------------------------------------------- synthetic code: functions from examples

# Each family: how its body is written for a constant k, and what it computes.
FAMILIES: dict[str, tuple[str, Any]] = {
    "x+k": ("x+{k}", lambda x, k: x + k),
    "x-k": ("x-{k}", lambda x, k: x - k),
    "k-x": ("{k}-x", lambda x, k: k - x),
    "x*k": ("x*{k}", lambda x, k: x * k),
    "max(x,k)": ("max(x,{k})", lambda x, k: max(x, k)),
}
_SWAPPED = {"k-x": "x-k"}  # the imperfect teacher's slip: `k-x` written with its operands swapped, as `x-k`
FUNCTION_NAME = "f"
_SHOWN_INPUTS = (0, 1)  # always shown: with f(0) and f(1) the family and k can be read off the examples
_THIRD_INPUT = (2, 20)  # one more shown input, drawn from this range
_TEST_SPAN = 20  # hidden tests draw distinct inputs from 2..max_constant+20, never one the prompt shows


def synthetic_functions(cfg: SyntheticTaskConfig, n: int, seed: int) -> pd.DataFrame:
    """`n` distinct code problems: write the body of `f` from three input/output examples, e.g.
    `prompt="#f(0)=3 f(1)=4 f(7)=10\\ndef f(x):return "`, `answer="x+3"`, with HumanEval-style hidden tests
    (`test`: `check(candidate)` asserting `num_tests` inputs the prompt does not show; `entry_point`: "f"), so a
    completion passes by being the right program, not by echoing the examples. The program the code_tests reward
    runs is prompt + completion (the HumanEval protocol). Drawn deterministically from `seed`."""
    families = list(dict.fromkeys(cfg.families))
    space = len(families) * cfg.max_constant * (_THIRD_INPUT[1] - _THIRD_INPUT[0] + 1)
    if n > space * 0.7:
        raise DataError(
            f"asked for {n} distinct problems but only about {space} exist with {len(families)} families and "
            f"max_constant={cfg.max_constant}; lower data.num_train/num_eval/num_probe or raise "
            "data.synthetic.max_constant"
        )
    rng = random.Random(f"functions-{seed}")
    rows: dict[str, dict[str, str]] = {}
    while len(rows) < n:
        family, k = rng.choice(families), rng.randint(1, cfg.max_constant)
        body, fn = FAMILIES[family]
        shown = [*_SHOWN_INPUTS, rng.randint(*_THIRD_INPUT)]
        examples = " ".join(f"{FUNCTION_NAME}({x})={fn(x, k)}" for x in shown)
        prompt = f"#{examples}\ndef {FUNCTION_NAME}(x):return "
        if prompt in rows:
            continue
        unseen = [x for x in range(2, cfg.max_constant + _TEST_SPAN + 1) if x not in shown]
        hidden = rng.sample(unseen, cfg.num_tests)
        if family == "max(x,k)":  # inputs on both sides of k, else `k` or `max(x,k+1)` could pass every test
            for side, (lo, hi) in enumerate(((2, k - 1), (k + 1, cfg.max_constant + _TEST_SPAN))):
                if not any(lo <= x <= hi for x in hidden) and any(lo <= x <= hi for x in unseen):
                    hidden[side] = rng.choice([x for x in unseen if lo <= x <= hi and x not in hidden])
        asserts = "".join(f"    assert candidate({x}) == {fn(x, k)}\n" for x in hidden)
        rows[prompt] = {
            "prompt": prompt,
            "answer": body.format(k=k),
            "test": f"def check(candidate):\n{asserts}",
            "entry_point": FUNCTION_NAME,
            "family": family,
        }
    return pd.DataFrame(list(rows.values()))


def function_family(body: str) -> str | None:
    """The family of a functions-task body (`x+3` -> `x+k`), or None for anything else (e.g. an arithmetic answer)."""
    generic = re.sub(r"\d+", "k", body.strip())
    return generic if generic in FAMILIES else None


def swap_subtractions(train: pd.DataFrame, rate: float, seed: int) -> pd.DataFrame:
    """An imperfect teacher's SFT targets for the functions task: on a `rate` fraction of the `k-x` problems, the
    completion swaps the operands (`7-x` written `x-7`, a program the hidden tests reject). The tests stay right, so
    rewards and evaluation are unaffected; SFT learns a coin flip on the operand order, which only the tests (GRPO)
    can correct. `x-k` problems keep the right target: a slip in both directions left GRPO one shared choice
    ("x first or k first") pulled both ways (benchmarks/LEARNING.md)."""
    if rate <= 0:
        return train
    rng = random.Random(f"teacher-order-slip-{seed}")
    slipped = [
        FAMILIES[_SWAPPED[family]][0].format(k=re.sub(r"\D", "", answer))
        if family in _SWAPPED and rng.random() < rate
        else completion
        for family, answer, completion in zip(train["family"], train["answer"], train["completion"], strict=True)
    ]
    changed = sum(new != old for new, old in zip(slipped, train["completion"], strict=True))
    logger.info("imperfect teacher: %d of %d SFT completions swap a subtraction's operands", changed, len(train))
    return train.assign(completion=slipped)
