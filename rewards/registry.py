"""The reward registry: names (or dotted paths) to reward functions."""

from __future__ import annotations

import difflib
import functools
import importlib
import numbers
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
        close = difflib.get_close_matches(path, REGISTRY, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise RewardError(
            f"reward {path!r} is neither registered nor a 'pkg.module:function' path; {hint}"
            f"registered: {', '.join(sorted(REGISTRY))}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = getattr(e, "name", None) or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            fix = (
                f"put {module_name.replace('.', '/')}.py beside the recipe or in the working directory, or install "
                "its package"
            )
        else:  # the module exists, but something it imports does not
            fix = "install what it imports"
        raise RewardError(f"reward {path!r}: cannot import module {module_name!r} ({e}); {fix}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise RewardError(f"reward {path!r}: module {module_name!r} has no attribute {attr!r}") from None


def build_reward(name: str, params: dict[str, Any] | None = None) -> RewardFn:
    """A ready reward function for one config entry, named `name` (TRL logs rewards by `__name__`)."""
    params = params or {}
    factory = REGISTRY[name] if name in REGISTRY else _import_dotted(name)
    try:
        fn = factory(**params) if params or name in REGISTRY else factory
    except RewardError:
        raise
    except (TypeError, ValueError) as e:  # a factory's own check of its params, or a missing / unknown one
        raise RewardError(f"reward {name!r}: bad params {params}: {e}") from e
    if not callable(fn):
        raise RewardError(f"reward {name!r} is not callable")

    @functools.wraps(fn)
    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        scores = fn(prompts=prompts, completions=completions, **kwargs)
        check_scores(name, scores, len(completions))
        return scores

    reward.__name__ = name.rsplit(":", 1)[-1]
    return reward


def check_scores(name: str, scores: Any, expected: int) -> None:
    """Raise RewardError unless `scores` holds `expected` entries, each a number or None ("not applicable").

    TRL turns the scores into a float tensor; a wrong count would misalign rewards and completions, and a string or
    a list in it would fail mid-training, so both are caught here, naming the reward and the entry."""
    try:
        count = len(scores)
    except TypeError:
        raise RewardError(
            f"reward {name!r} returned a {type(scores).__name__}, not a list of {expected} scores (one per completion)"
        ) from None
    if count != expected:
        raise RewardError(
            f"reward {name!r} returned {count} scores for {expected} completions; return one score per completion "
            "(None where the reward does not apply)"
        )
    for i, score in enumerate(scores):
        # numbers.Real covers float, int, bool and NumPy scalars; a 0-d array or tensor is one number too
        if score is not None and not isinstance(score, numbers.Real) and getattr(score, "ndim", None) != 0:
            raise RewardError(
                f"reward {name!r} returned {score!r} ({type(score).__name__}) for completion {i}; a score is a number, "
                "or None where the reward does not apply"
            )


def build_rewards(specs: Sequence[Any]) -> tuple[list[RewardFn], list[float]]:
    """Reward functions and weights for a list of `RewardSpec`s (or dicts with name/weight/params)."""
    fns, weights = [], []
    for spec in specs:
        spec = spec if isinstance(spec, dict) else spec.model_dump()
        fns.append(build_reward(spec["name"], spec.get("params")))
        weights.append(float(spec.get("weight", 1.0)))
    return fns, weights
