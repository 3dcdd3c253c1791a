"""The tool registry: `grpo.tools` entries (built-in names or `pkg.module:function` paths, a built-in tool with its
`grpo.tool_params`) and `grpo.environment` (a class by dotted path) resolved into what TRL's GRPOTrainer takes,
checked first, with errors that name the field and the fix.

Checked before training: every tool must give TRL a JSON schema (`transformers.utils.get_json_schema`: type hints on
every argument, a Google-style docstring with an `Args:` line for each), since a tool without one fails inside the
trainer's first rollout; an environment must define `reset` and at least one public method, each a valid tool.

Contained: a user's tool (or environment method) runs in the training process, where one that hangs would stall
every rollout of the step and one that raises or returns megabytes would reach the model's context. So each is
wrapped (`contain`): the call runs in a daemon thread and is abandoned after `UserToolLimits.timeout_s` (a Python
thread cannot be killed; it keeps running and its result is thrown away, as the reward registry does), an exception
(any BaseException) or the time limit becomes `ToolFailure` with a message cut to `max_chars` (a failed call, as TRL
counts failures: agents/failure.py), and the result is cut to `max_chars`. The built-in tools bound themselves.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import importlib
import inspect
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

from grpo_pipeline.agents.calculator import calculator
from grpo_pipeline.agents.failure import ToolFailure
from grpo_pipeline.agents.python_tool import python, python_tool, truncate
from grpo_pipeline.rewards.sandbox import SandboxUnavailable

logger = logging.getLogger(__name__)

BUILTIN_TOOLS: dict[str, Callable[..., str]] = {"calculator": calculator, "python": python}
# the built-in tools that take parameters (`grpo.tool_params`): a factory of the tool from them
TOOL_FACTORIES: dict[str, Callable[..., Callable[..., str]]] = {"python": python_tool}


class ToolError(ValueError):
    """A tool or environment that cannot be used as configured; the message names the field and the fix."""


@dataclass(frozen=True)
class UserToolLimits:
    """How long one call of a user's tool may take and how much of its result reaches the model."""

    timeout_s: float = 10.0
    max_chars: int = 2000


DEFAULT_USER_LIMITS = UserToolLimits()


def resolve_tool(
    name: str, field: str = "grpo.tools", params: dict[str, Any] | None = None, params_field: str = "grpo.tool_params"
) -> Callable[..., Any]:
    """The function behind one `grpo.tools` entry, checked (`check_tool`); a user's tool comes back contained. A
    built-in tool with `params` (its `grpo.tool_params` entry) is built by its factory, which may refuse (e.g. the
    python tool with `isolation: bwrap` where bubblewrap cannot start)."""
    if params:
        return configured_tool(name, params, f"{params_field}.{name}")
    if name in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[name]
    if ":" not in name:
        close = difflib.get_close_matches(name, BUILTIN_TOOLS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ToolError(
            f"{field}: {name!r} is neither a built-in tool ({', '.join(BUILTIN_TOOLS)}) nor a dotted path "
            f"'pkg.module:function'; {hint}"
        )
    fn = import_dotted(name, field)
    if not callable(fn) or inspect.isclass(fn):
        raise ToolError(f"{field}: {name!r} is a {type(fn).__name__}, not a function; point it at a function")
    check_tool(fn, f"{field}: {name!r}")
    return contain(fn)


def configured_tool(name: str, params: dict[str, Any], field: str) -> Callable[..., str]:
    """The built-in tool `name` built from `params`, or ToolError naming `field` and the fix."""
    if name not in TOOL_FACTORIES:
        takes = ", ".join(TOOL_FACTORIES)
        raise ToolError(f"{field}: only built-in tools take params ({takes}); {name!r} takes none, remove the entry")
    try:
        return TOOL_FACTORIES[name](**params)
    except TypeError as e:
        raise ToolError(f"{field}: {e}; the tool's params are {inspect.signature(TOOL_FACTORIES[name])}") from None
    except (SandboxUnavailable, ValueError) as e:
        raise ToolError(f"{field}: {e}") from None


def import_dotted(path: str, field: str) -> Any:
    """The attribute `path` ('pkg.module:attribute') names, or ToolError saying what to change."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ToolError(
            f"{field}: cannot import {module_name!r} for {path!r} ({e}); put {module_name.replace('.', '/')}.py beside "
            "the recipe or in the working directory, or install its package"
        ) from e
    if not hasattr(module, attr):
        raise ToolError(f"{field}: module {module_name!r} has no attribute {attr!r} (from {path!r})")
    return getattr(module, attr)


def check_tool(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    """TRL's JSON schema of `fn` (what the chat template renders), or ToolError saying what the function lacks."""
    try:
        return get_json_schema(fn)
    except Exception as e:  # TypeHintParsingException, DocstringParsingException, or a signature it cannot read
        raise ToolError(
            f"{where}: TRL cannot describe this tool to the model ({type(e).__name__}: {e}). A tool needs a type hint "
            "on every argument and a Google-style docstring: a summary line, then 'Args:' with one "
            "'name: description' line per argument"
        ) from None


def contain(fn: Callable[..., Any], limits: UserToolLimits = DEFAULT_USER_LIMITS) -> Callable[..., Any]:
    """`fn` under `limits`: its result as text cut to `limits.max_chars`; an exception or a missed time limit raises
    ToolFailure saying so. The wrapper keeps `fn`'s name, signature and docstring (TRL's schema reads them)."""
    name = getattr(fn, "__name__", "tool")
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def contained_async(*args: Any, **kwargs: Any) -> Any:
            try:
                result = await asyncio.wait_for(fn(*args, **kwargs), timeout=limits.timeout_s)
            except TimeoutError:
                raise _timed_out(name, limits) from None
            except Exception as e:
                raise _failed(e, limits) from None
            return _as_text(result, limits)

        return contained_async

    @functools.wraps(fn)
    def contained(*args: Any, **kwargs: Any) -> Any:
        results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def work() -> None:
            try:
                results.put((True, fn(*args, **kwargs)))
            except BaseException as e:  # handed to the caller's thread as a message
                results.put((False, e))

        threading.Thread(target=work, name=f"tool-{name}", daemon=True).start()
        try:
            ok, value = results.get(timeout=limits.timeout_s)
        except queue.Empty:
            raise _timed_out(name, limits) from None
        if not ok:
            raise _failed(value, limits)
        return _as_text(value, limits)

    return contained


def _timed_out(name: str, limits: UserToolLimits) -> ToolFailure:
    logger.warning("tool %r did not return within %g s; the model is told so and the call is abandoned",
                   name, limits.timeout_s)  # fmt: skip
    return ToolFailure(f"the tool did not return within {limits.timeout_s:g} s")


def _failed(error: BaseException, limits: UserToolLimits) -> ToolFailure:
    return ToolFailure(f"{type(error).__name__}: {truncate(str(error), limits.max_chars)}")


def _as_text(result: Any, limits: UserToolLimits) -> Any:
    """A result as TRL passes it on (`str(result)`, or a list of content blocks as it is), cut to the limit."""
    if isinstance(result, list) and all(isinstance(part, dict) for part in result):
        return result  # multimodal content blocks, which TRL hands to the template unchanged
    return truncate(str(result), limits.max_chars)


def load_environment(path: str, field: str = "grpo.environment") -> type:
    """The environment class at `path`, checked: `reset`, at least one public method, each a valid tool."""
    cls = import_dotted(path, field)
    if not inspect.isclass(cls):
        raise ToolError(f"{field}: {path!r} is a {type(cls).__name__}, not a class; point it at the class")
    if not callable(getattr(cls, "reset", None)):
        raise ToolError(f"{field}: {path!r} has no reset(**row) method; add one (it may return text for the prompt)")
    methods = public_methods(cls)
    if not methods:
        raise ToolError(f"{field}: {path!r} has no public method for the model to call; add one (typed, documented)")
    for method in methods:
        check_tool(getattr(cls, method), f"{field}: {path}.{method}")
    return cls


def public_methods(cls: type) -> list[str]:
    """The methods TRL offers the model as tools: functions on the class not starting with `_`, but `reset` and
    `get_reward` (trl/trainer/grpo_trainer.py, GRPOTrainer.__init__, 'Set up the environments')."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]


def contained_environment(cls: type, limits: UserToolLimits = DEFAULT_USER_LIMITS) -> type:
    """A subclass of `cls` whose tool methods are contained (`contain`); `reset` and `get_reward` are left as they
    are (a failure there is the environment's, not the model's, and must stop the run)."""
    methods = {}
    for name in public_methods(cls):
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, staticmethod):  # no `self`: wrap the function and keep it static
            methods[name] = staticmethod(contain(raw.__func__, limits))
        else:
            methods[name] = contain(getattr(cls, name), limits)
    return type(cls.__name__, (cls,), {**methods, "__module__": cls.__module__, "__doc__": cls.__doc__})
