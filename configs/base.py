"""What every config section shares: the strict base class, the error that names the field (and a validation
error's lines, each naming one), and the mark of a field left out of the stage keys (`UNKEYED`, read by `keyed_view`
and `section_hash`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python

# A field that changes how a stage runs but not what it computes (how often it checkpoints): left out of the
# stage keys (`section_hash`), so changing it neither reruns the stage nor loses the checkpoints to resume from.
UNKEYED: dict[str, Any] = {"unkeyed": True}


class ConfigError(ValueError):
    """A recipe or override that cannot be used; the message says which field and how to fix it."""


class Section(BaseModel):
    """A config section: unknown keys are errors (a misspelt field fails, naming it), values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def save_every_steps_field(default: int) -> Any:
    """The checkpoint interval field that SFT and GRPO share (tasks/training/checkpoints.py)."""
    return Field(
        default=default,
        ge=0,
        json_schema_extra=UNKEYED,
        description="Save a resumable checkpoint (model, optimizer, scheduler, RNG states, step) every N optimizer "
        "steps beside the stage's output; a rerun of the same config or a Prefect retry resumes from the newest "
        "complete one. 0 turns it off.",
    )


def section_hash(section: Any) -> str:
    """A stable sha256 of the canonical JSON of a config section, or of any value made of pydantic models, paths
    and JSON-able containers (the config hash, and every stage key in tasks/core/stage.py). Fields marked `UNKEYED`
    are left out."""
    return hashlib.sha256(json.dumps(to_jsonable_python(keyed_view(section)), sort_keys=True).encode()).hexdigest()


def keyed_view(value: Any) -> Any:
    """`value` with the fields of its pydantic models that are marked `UNKEYED` left out, at any depth."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        return {k: keyed_view(getattr(value, k)) for k, f in fields.items() if f.json_schema_extra != UNKEYED}
    if isinstance(value, list | tuple):
        return [keyed_view(v) for v in value]
    if isinstance(value, dict):
        return {k: keyed_view(v) for k, v in value.items()}
    return value


def format_validation_error(err: ValidationError, origin: str) -> str:
    """A pydantic error as the lines a user reads: `invalid config (<origin>):`, then `  - <field>: <what to change>`
    for each problem."""
    lines = [f"invalid config ({origin}):"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (`grpo-pipeline config --schema` lists every field)"
        elif not (e["type"] == "value_error" and isinstance(e.get("input"), dict)):  # a section's check names fields
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  - {field}: {msg}" if field else f"  - {msg}")  # a whole-config check names its fields
    return "\n".join(lines)
