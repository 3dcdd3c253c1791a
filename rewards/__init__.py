"""Reward functions: one contract, one registry.

Contract (TRL's): `reward(prompts, completions, **dataset_columns) -> list[float | None]`, where None means
"not applicable to this row". Completions are plain strings or chat messages; `completion_text` handles both.
Rewards are built from config entries `{name, weight, params}`: `name` is a registered name or a dotted path
`pkg.module:function` to a user's own reward (or reward factory, when `params` are given). See docs/rewards.md.

    rewards/
      registry.py     the registry, building rewards from config, per-call time limits
      arith.py, math.py, format.py, length.py, judge.py   built-in rewards
      code.py         code_tests: programs run against their tests in the sandbox
      code_asserts.py assert lists (MBPP) whose function under test is named like a builtin
      code_formats/   test cases of public code datasets (APPS/TACO, CodeContests, LiveCodeBench, open-r1)
      sandbox/        the bubblewrap sandbox code runs in (host side)
      harness/        the sandbox's fork server and test runners (standard library only; joined into one source)
"""

# Importing the built-in modules registers their rewards.
from grpo_pipeline.rewards import arith as _arith  # noqa: F401
from grpo_pipeline.rewards import code as _code  # noqa: F401
from grpo_pipeline.rewards import format as _format  # noqa: F401
from grpo_pipeline.rewards import judge as _judge  # noqa: F401
from grpo_pipeline.rewards import length as _length  # noqa: F401
from grpo_pipeline.rewards import math as _math  # noqa: F401
from grpo_pipeline.rewards.registry import REGISTRY, build_reward, build_rewards, build_spec, register
from grpo_pipeline.tasks.core.chat import completion_text

__all__ = ["REGISTRY", "build_reward", "build_rewards", "build_spec", "completion_text", "register"]
