"""A synthetic task that pays to use a tool (data.synthetic.kind: tool_arithmetic): additions too long for the tiny
model's own digits, with SFT demonstrations of an imperfect teacher that calls the calculator in text.

The call syntax is GSM8K's calculator annotation (agents/text_tools.py): `4821+9097=` -> `<<4821+9097=13918>>13918`.
The teacher (`teacher_completion`) is imperfect in the ways the issue asks for, and systematically so, because greedy
decoding imitates a teacher's majority: random slips spread over every problem leave the greedy policy perfect.
  - It trusts itself on problems whose first operand is "small" (below half its range): there it skips the tool and
    guesses on SKIP_SMALL of them, writing the digit-wise sum without carries (right only when nothing carries).
    So the SFT policy guesses on those problems, greedily, and calls on them now and then when it samples: the
    groups GRPO learns from (DESIGN.md: pass rates around 0.1-0.6 carry the signal).
  - On the rest it calls, but on SKIP_LARGE of them it guesses anyway, and WRONG_CALL of its calls copy the
    expression with one digit changed (the tool then answers another question).
GRPO, rewarded on the final answer only (rewards/math.py: final_answer), must learn to call on every problem and copy
the expression exactly.
"""

from __future__ import annotations

import random

import pandas as pd

from grpo_pipeline.configs.data import SyntheticTaskConfig
from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.synthetic import synthetic_arithmetic

# agents/text_tools.py's syntax, not imported from there: the data stage's key would then cover the rewards and the
# trainer (tests/test_stage_keys.py); tests/test_text_tools.py checks that the two agree
CALL_OPEN, TOOL_RESULT_END = "<<", ">>"
SKIP_SMALL = 0.8  # share of "small" problems the teacher answers without the tool
SKIP_LARGE = 0.1  # share of the other problems it answers without the tool
WRONG_CALL = 0.2  # share of its calls whose expression has one digit changed


def carry_free_sum(a: int, b: int) -> int:
    """The digit-wise sum without carries (4821+9097 -> 3818): the teacher's guess."""
    digits, place = 0, 1
    while a or b:
        digits += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return digits


def slip_digit(number: int, rng: random.Random) -> int:
    """`number` with one of its digits replaced by another (the first digit never by 0)."""
    text = list(str(number))
    i = rng.randrange(len(text))
    choices = [d for d in "0123456789" if d != text[i] and not (i == 0 and d == "0")]
    text[i] = rng.choice(choices)
    return int("".join(text))


def teacher_completion(prompt: str, rng: random.Random, small_below: int) -> tuple[str, str]:
    """The teacher's completion of `prompt` ('a+b=') and what it did: 'call', 'wrong_call' or 'guess'."""
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    skip = SKIP_SMALL if a < small_below else SKIP_LARGE
    if rng.random() < skip:
        return str(carry_free_sum(a, b)), "guess"
    if rng.random() < WRONG_CALL:
        a2, b2 = (slip_digit(a, rng), b) if rng.random() < 0.5 else (a, slip_digit(b, rng))
        return f"{CALL_OPEN}{a2}+{b2}={a2 + b2}{TOOL_RESULT_END}{a2 + b2}", "wrong_call"
    return f"{CALL_OPEN}{a}+{b}={a + b}{TOOL_RESULT_END}{a + b}", "call"


def tool_arithmetic(cfg: SyntheticTaskConfig, n: int, seed: int) -> pd.DataFrame:
    """`n` distinct additions (`synthetic_arithmetic`, '+' only) with the imperfect teacher's SFT completions in
    `completion` (the data stage keeps them for the training split's SFT; `answer` is always the true sum)."""
    if list(cfg.operations) != ["+"]:
        raise DataError(
            f"data.synthetic.operations is {cfg.operations}: kind tool_arithmetic writes additions only; set "
            "data.synthetic.operations to ['+']"
        )
    rows = synthetic_arithmetic(cfg, n, seed)
    rng = random.Random(f"tool-teacher-{seed}")
    small_below = (10 ** (cfg.min_digits - 1) + 10**cfg.max_digits) // 2
    done = [teacher_completion(p, rng, small_below) for p in rows["prompt"]]
    kinds = pd.Series([k for _, k in done]).value_counts().to_dict()
    logger.info("imperfect tool teacher over %d problems: %s", n, ", ".join(f"{v} {k}" for k, v in kinds.items()))
    return rows.assign(completion=[c for c, _ in done])
