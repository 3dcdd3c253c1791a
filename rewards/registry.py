"""The reward registry: names (or dotted paths) to reward functions."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

RewardFn = Callable[..., list[float | None]]
# name -> factory(**params) -> reward function
REGISTRY: dict[str, Callable[..., RewardFn]] = {}


class RewardError(ValueError):
    """A reward that cannot be built from its config entry."""


def register(name: str) -> Callable[[Callable[..., RewardFn]], Callable[..., RewardFn]]:
    """Register a reward *factory* under `name`: `factory(**params)` returns the reward function."""

    def deco(factory: Callable[..., RewardFn]) -> Callable[..., RewardFn]:
        if name in REGISTRY:
            raise RewardError(f"reward {name!r} is registered twice")
        REGISTRY[name] = factory
        return factory

    return deco


def completion_text(completion: Any) -> str:
    """The text of a completion: a plain string, or the last message's content in chat format."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    raise TypeError(f"completion of type {type(completion).__name__} is neither a string nor chat messages")


def _import_dotted(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not attr:
        raise RewardError(
            f"reward {path!r} is neither registered ({sorted(REGISTRY)}) nor a 'pkg.module:function' path"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RewardError(f"reward {path!r}: cannot import module {module_name!r} ({e})") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RewardError(f"reward {path!r}: module {module_name!r} has no attribute {attr!r}") from None


def build_reward(name: str, params: dict[str, Any] | None = None) -> RewardFn:
    """A ready reward function for one config entry, named `name` (TRL logs rewards by `__name__`)."""
    params = params or {}
    if name in REGISTRY:
        try:
            fn = REGISTRY[name](**params)
        except TypeError as e:
            raise RewardError(f"reward {name!r}: bad params {params}: {e}") from e
    else:
        target = _import_dotted(name)
        fn = target(**params) if params else target
        if not callable(fn):
            raise RewardError(f"reward {name!r} is not callable")

    @functools.wraps(fn)
    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        scores = fn(prompts=prompts, completions=completions, **kwargs)
        if len(scores) != len(completions):
            raise RewardError(f"reward {name!r} returned {len(scores)} scores for {len(completions)} completions")
        return scores

    reward.__name__ = name.rsplit(":", 1)[-1]
    return reward


def build_rewards(specs: Sequence[Any]) -> tuple[list[RewardFn], list[float]]:
    """Reward functions and weights for a list of `RewardSpec`s (or dicts with name/weight/params)."""
    fns, weights = [], []
    for spec in specs:
        spec = spec if isinstance(spec, dict) else spec.model_dump()
        fns.append(build_reward(spec["name"], spec.get("params")))
        weights.append(float(spec.get("weight", 1.0)))
    return fns, weights
