"""What a failed tool call is: one definition, shared by training and evaluation.

Training through the chat template runs TRL 1.16's loop (`GRPOTrainer._tool_call_loop`), which counts a call as
failed exactly when it raised (an exception from the tool, a tool name it does not know, a call type it does not
support) and tells the model `str({"error": str(exception)})`; its `tools/failure_frequency` is those failures per
call. A tool that *returns* an error message is a success to TRL. So every tool here raises `ToolFailure` when a call
gives no result: the calculator refusing an expression, the python tool's program raising, exiting non-zero or being
stopped (time, output, memory), a user's tool raising or not returning in time (agents/registry.py `contain`). The
episode loop (agents/episodes.py) counts the same calls the same way (`run_call`), for the text loop too, whose
model reads the failure as `error: <message>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

TEXT_ERROR = "error: "  # how the text loop writes a failed call's message (the tiny model's SFT data teaches it)


class ToolFailure(Exception):
    """A tool call that gave no result; the message is what the model is told about why."""


def run_call(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> tuple[Any, Exception | None]:
    """(`fn(**arguments)`, None), or (None, the exception) when the call failed: it raised, as TRL counts failures."""
    try:
        return fn(**arguments), None
    except Exception as e:  # any exception is the model's failed call, as in TRL's loop; BaseException is not
        return None, e
