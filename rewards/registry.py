"""The reward registry: names (or dotted paths) to reward functions, each call under a time limit.

Time limits. A reward that hangs (a judge server that never answers, a user reward stuck in a loop) would stop
training forever, and a Python thread cannot be killed. So every call of a built reward runs in a fresh daemon thread
and the caller waits at most `timeout_s` for it (`RewardSpec.timeout_s`, default 300 s). A call that misses its limit
scores None for all its rows, with one warning naming the reward; the stuck thread is abandoned, keeps running until
the reward returns (its result is thrown away) and the next call gets a fresh thread. Limits:
- an abandoned call still holds what it holds (CPU, a connection, a lock of its own) until it returns, and one that
  waits on a `concurrent.futures` thread pool of its own delays the interpreter's exit until that pool is done;
  rewards that do slow work read `call_deadline()` to give up early (the judge and math-verify do);
- a reward that times out on more than half of its rows over its last `TIMEOUT_WINDOW_CALLS` calls (counted from
  `TIMEOUT_MIN_CALLS` calls and `TIMEOUT_MIN_ROWS` rows on) stops the run with a RewardError, and so does one with
  more than `MAX_STUCK_CALLS` abandoned calls still running, so stuck threads cannot pile up without bound;
- the thread starts with the caller's context variables (Prefect's run context), torch grad mode and CUDA device, but
  not with other thread-local state of the caller;
- `timeout_s: null` runs the reward in the caller's thread with no limit (for a reward that must run there).
"""

from __future__ import annotations

import asyncio
import contextvars
import difflib
import functools
import importlib
import importlib.util
import inspect
import logging
import numbers
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpo_pipeline.tasks.core.runtime import source_roots

logger = logging.getLogger(__name__)

RewardFn = Callable[..., list[float | None]]
# name -> factory(**params) -> reward function
REGISTRY: dict[str, Callable[..., RewardFn]] = {}


class RewardError(ValueError):
    """A reward that cannot be built from its config entry, or that keeps missing its time limit."""


DEFAULT_TIMEOUT_S = 300.0  # RewardSpec.timeout_s's default: the longest one reward call may take
TIMEOUT_WINDOW_CALLS = 16  # the recent calls over which the share of timed-out rows is measured
TIMEOUT_MIN_CALLS = 3  # ... once the window holds at least this many calls
TIMEOUT_MIN_ROWS = 16  # ... and this many rows
MAX_STUCK_CALLS = 8  # abandoned calls of one reward that may still be running

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("reward_call_deadline", default=None)


def call_deadline() -> float | None:
    """The `time.monotonic()` by which the reward call running in this thread must return, or None (no limit).

    A call past it has already been scored None by the registry and its result will be thrown away, so a reward that
    does slow work (HTTP requests, a worker process) can read this to stop early and to bound its own waits."""
    return _DEADLINE.get()


def register(name: str) -> Callable[[Callable[..., RewardFn]], Callable[..., RewardFn]]:
    """Register a reward *factory* under `name`: `factory(**params)` returns the reward function."""

    def deco(factory: Callable[..., RewardFn]) -> Callable[..., RewardFn]:
        if name in REGISTRY:
            raise RewardError(f"reward {name!r} is registered twice")
        REGISTRY[name] = factory
        return factory

    return deco


def _import_dotted(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not attr:
        close = difflib.get_close_matches(path, REGISTRY, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise RewardError(
            f"reward {path!r} is neither registered nor a 'pkg.module:function' path; {hint}"
            f"registered: {', '.join(sorted(REGISTRY))}"
        )
    shadowed = _project_folder(module_name)
    if shadowed:
        raise RewardError(
            f"reward {path!r}: module {module_name!r} resolves to the project's own folder {shadowed}, not to a module "
            f"of yours (the project's folders import only as grpo_pipeline.*); put {module_name.replace('.', '/')}.py "
            "beside the recipe or in the working directory, or install its package"
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


def _project_folder(module_name: str) -> str | None:
    """The project's design folder (rewards/, tasks/, ...) that `module_name` would import from under its bare name,
    when the checkout is still on sys.path (pytest's rootdir, a process started there); None otherwise.

    Only the lookup runs, nothing is imported: importing the folder as `rewards` would run its modules a second time,
    beside `grpo_pipeline.rewards`."""
    top = module_name.partition(".")[0]
    if top not in ("configs", "flows", "tasks", "rewards", "agents") or top in sys.modules:
        return None
    spec = importlib.util.find_spec(top)
    locations = (spec.submodule_search_locations or []) if spec else []
    roots = source_roots()
    return next((str(Path(loc)) for loc in locations if Path(loc).resolve().parent in roots), None)


def build_reward(
    name: str, params: dict[str, Any] | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S
) -> RewardFn:
    """A ready reward function for one config entry, named `name` (TRL logs rewards by `__name__`).

    Each call runs under a limit of `timeout_s` seconds (None: no limit, in the caller's thread); a call over it
    scores None for its rows (see the module docstring). A coroutine function is run to completion in the call's
    thread, so async user rewards work too."""
    if timeout_s is not None and not timeout_s > 0:
        raise RewardError(f"reward {name!r}: timeout_s must be > 0 seconds (or null for no limit), got {timeout_s}")
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

    limited = None if timeout_s is None else _TimeLimit(name, timeout_s)

    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        kwargs = {"prompts": prompts, "completions": completions, **kwargs}
        scores = _run(fn, kwargs) if limited is None else limited.call(fn, kwargs, len(completions))
        check_scores(name, scores, len(completions))
        return scores

    functools.update_wrapper(reward, fn)
    reward.__name__ = name.rsplit(":", 1)[-1]
    return reward


def _run(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """`fn(**kwargs)`, awaited here when it is a coroutine (an async reward)."""
    result = fn(**kwargs)
    if inspect.isawaitable(result):

        async def wait() -> Any:
            return await result

        result = asyncio.run(wait())
    return result


def _thread_setup() -> Callable[[], None]:
    """What a new thread must take over from this one: torch's grad mode and CUDA device are per thread (a reward
    model called from TRL's no-grad context, on the local rank's GPU, must stay so)."""
    torch = sys.modules.get("torch")  # never import torch just for this
    if torch is None:
        return lambda: None
    grad = torch.is_grad_enabled()
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def setup() -> None:
        torch.set_grad_enabled(grad)
        if device is not None:
            torch.cuda.set_device(device)

    return setup


class _TimeLimit:
    """Runs one reward's calls in daemon threads, waits at most `timeout_s` for each, and stops the run (RewardError)
    when the reward keeps missing its limit."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name, self.timeout_s = name, timeout_s
        self._lock = threading.Lock()
        self._recent: deque[tuple[int, int]] = deque(maxlen=TIMEOUT_WINDOW_CALLS)  # (rows, timed-out rows) per call
        self._stuck: list[threading.Thread] = []

    def call(self, fn: Callable[..., Any], kwargs: dict[str, Any], rows: int) -> Any:
        results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        deadline, setup = time.monotonic() + self.timeout_s, _thread_setup()

        def work() -> None:
            _DEADLINE.set(deadline)
            setup()
            try:
                results.put((True, _run(fn, kwargs)))
            except BaseException as e:  # re-raised in the caller's thread, with this thread's traceback
                results.put((False, e))

        # a copy of the caller's context: Prefect's run context (get_run_logger) and the like reach the reward
        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(work,), name=f"reward-{self.name}", daemon=True)
        thread.start()
        try:
            ok, value = results.get(timeout=self.timeout_s)
        except queue.Empty:
            return self._timed_out(thread, rows)
        with self._lock:
            self._recent.append((rows, 0))
        if not ok:
            raise value
        return value

    def _timed_out(self, thread: threading.Thread, rows: int) -> list[None]:
        with self._lock:
            self._recent.append((rows, rows))
            self._stuck = [t for t in self._stuck if t.is_alive()] + [thread]
            calls, seen = len(self._recent), sum(r for r, _ in self._recent)
            missed, stuck = sum(t for _, t in self._recent), len(self._stuck)
        fix = (
            f"Fix what hangs (a judge server that does not answer, a loop in the reward) or, if the reward is only "
            f"slow, raise `timeout_s` on its reward entry in the recipe (e.g. {{name: {self.name}, timeout_s: "
            f"{max(2 * self.timeout_s, DEFAULT_TIMEOUT_S):g}}}); `timeout_s: null` runs it without a limit."
        )
        if calls >= TIMEOUT_MIN_CALLS and seen >= TIMEOUT_MIN_ROWS and 2 * missed > seen:
            raise RewardError(
                f"reward {self.name!r} did not return within timeout_s={self.timeout_s:g} s on {missed} of the "
                f"{seen} rows of its last {calls} calls, more than half: the run stops rather than train without it. "
                + fix
            )
        if stuck > MAX_STUCK_CALLS:
            raise RewardError(
                f"reward {self.name!r}: {stuck} of its calls missed timeout_s={self.timeout_s:g} s and are still "
                f"running (at most {MAX_STUCK_CALLS} may be): the run stops before stuck threads pile up. " + fix
            )
        logger.warning(
            "reward %r did not return within timeout_s=%g s: its %d rows score None (%d of the %d rows of its last "
            "%d calls timed out); the call is left running in a daemon thread and its result will be ignored",
            self.name,
            self.timeout_s,
            rows,
            missed,
            seen,
            calls,
        )
        return [None] * rows


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
    """Reward functions and weights for a list of `RewardSpec`s (or dicts with name/weight/params/timeout_s)."""
    fns, weights = [], []
    for spec in specs:
        fns.append(build_spec(spec))
        weights.append(float(_as_dict(spec).get("weight", 1.0)))
    return fns, weights


def build_spec(spec: Any) -> RewardFn:
    """The reward function of one `RewardSpec` (or a dict with name, params and timeout_s): what training, the
    evaluation, the probes and the checks all build the correctness reward from, so its params are the same
    everywhere."""
    spec = _as_dict(spec)
    return build_reward(spec["name"], spec.get("params"), spec.get("timeout_s", DEFAULT_TIMEOUT_S))


def _as_dict(spec: Any) -> dict[str, Any]:
    """A spec as a dict: a RewardSpec's fields, a dict as it is, a bare name as {"name": name}."""
    if isinstance(spec, str):
        return {"name": spec}
    return spec if isinstance(spec, dict) else spec.model_dump()
