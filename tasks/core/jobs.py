"""A stage call as data: the job (module, stage, arguments as JSON) that runs a stage in another process.

A multi-process launch (tasks/core/launch.py) writes it to a job file, a Ray Train job (tasks/core/ray_launch.py)
and a Ray task (tasks/core/ray_tasks.py) send it to their workers; each of those processes rebuilds the stage's
arguments from their type hints and calls it. Inside such a process the stage trains or scores there and never
launches again (`in_launched_process`), and process 0 alone logs and saves (`is_main_process`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

LAUNCH_ID_ENV = "GRPO_PIPELINE_LAUNCH_ID"  # one per launch: names what its processes write together


def in_launched_process() -> bool:
    """True inside a process that `launch` started (it must train, never launch again)."""
    return LAUNCH_ID_ENV in os.environ


def is_main_process() -> bool:
    """True in the pipeline's own process and in process 0 of a launch."""
    return int(os.environ.get("RANK", "0")) == 0


def job_spec(fn: Callable[..., Any], params: dict[str, Any]) -> dict[str, Any]:
    """The job file's content: which stage to call, and its arguments as JSON (`job_params`)."""
    return {"module": fn.__module__, "name": fn.__name__, "params": job_params(params)}


def job_params(params: dict[str, Any]) -> dict[str, Any]:
    """The stage's arguments as JSON. A config section carries only the fields that were set, so that the launched
    process rebuilds it as the user wrote it (a full dump rebuilds an equal config too: no validator depends on
    which fields were set, tests/test_round_trips.py)."""
    return {
        name: value.model_dump(mode="json", exclude_unset=True)
        if isinstance(value, BaseModel)
        else to_jsonable_python(value)
        for name, value in params.items()
    }


def rebuild_job(job: dict[str, Any]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The stage a job names and its arguments, rebuilt from their type hints."""
    stage = getattr(importlib.import_module(job["module"]), job["name"])
    hints = typing.get_type_hints(inspect.unwrap(stage))  # the stage's own function, under @stage and @launched
    return stage, {name: TypeAdapter(hints[name]).validate_python(value) for name, value in job["params"].items()}
