"""The configuration reference (docs/configuration-reference.md), generated from the config schema.

Every field of `PipelineConfig` and of each section below it, in the order the schema declares them: its dotted
name, type, constraints, default and help text. The page is checked in and a test regenerates it
(tests/test_config_reference.py), so the docs cannot drift from the schema. Regenerate it with

    python -m grpo_pipeline.configs.reference docs/configuration-reference.md

or print it with `grpo-pipeline config --reference`.
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from grpo_pipeline.configs.base import UNKEYED
from grpo_pipeline.configs.schema import PipelineConfig

REGENERATE = "python -m grpo_pipeline.configs.reference docs/configuration-reference.md"

HEADER = f"""\
# Configuration reference

<!-- Generated from the config schema (configs/reference.py); do not edit by hand. Regenerate with
     {REGENERATE} -->

Every field of a recipe, section by section, as the schema (`configs/schema.py` and the section modules beside it)
declares it. A recipe sets fields in YAML (`grpo: {{learning_rate: 5.0e-5}}`); the command line overrides any of
them by its dotted name (`grpo.learning_rate=5e-5`, values parsed as YAML). Unknown keys are errors. How the
pieces fit together is in [Configuration](configuration.md); `grpo-pipeline config --config RECIPE` prints a
recipe fully resolved.

A field marked *unkeyed* is left out of its section's hash, which the stage keys are made of: it changes how a
stage runs (how often it checkpoints, where a server is), not what it computes, so changing it reruns no cached
stage. A section so marked reaches a stage some other way: the difficulty filter through the split it writes,
whose fingerprint the filtered round is keyed on.
"""


def render(root: type[BaseModel] = PipelineConfig) -> str:
    """The reference page in Markdown: one table per section, the top level first, then each section where the
    schema first names it (depth first)."""
    parts = [HEADER]
    for path, model in _sections(root, ""):
        parts.append(_section(path, model))
    return "\n".join(parts)


def _sections(model: type[BaseModel], path: str) -> list[tuple[str, type[BaseModel]]]:
    """`(dotted path, model)` for `model` and every section below it; a list's item is named `path[]`, a dict's
    value `path.<key>`."""
    found = [(path, model)]
    for name, field in model.model_fields.items():
        for suffix, sub in _submodels(field.annotation):
            found += _sections(sub, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")
    return found


def _submodels(annotation: Any, suffix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """The config models an annotation holds, with the suffix that names where (`[]` for a list's items)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(suffix, annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset):
        return [m for a in args if a is not Ellipsis for m in _submodels(a, suffix + "[]")]
    if origin is dict:
        return _submodels(args[1], suffix + ".<key>") if len(args) == 2 else []
    return [m for a in args for m in _submodels(a, suffix)]


def _section(path: str, model: type[BaseModel]) -> str:
    title = f"`{path}`" if path else "Top level"
    lines = [f"## {title} {{#{_anchor(path)}}}", ""]
    doc = _paragraph(model.__doc__)
    if doc:
        lines += [_one_line(doc), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        dotted = f"{path}.{name}" if path else name
        lines.append(f"| `{dotted}` | {_type_cell(dotted, field)} | {_default(field)} | {_description(field)} |")
    return "\n".join(lines) + "\n"


def _anchor(path: str) -> str:
    """The heading's id (attr_list), the path with every other character a dash: `grpo-difficulty_filter`."""
    return re.sub(r"[^a-z0-9_]+", "-", path.lower()).strip("-") or "top-level"


def _paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring (a section's purpose), or '' for the inherited or missing one."""
    if not doc or doc == BaseModel.__doc__:
        return ""
    return doc.strip().split("\n\n")[0]


def _type_cell(path: str, field: FieldInfo) -> str:
    text = _type(field.annotation)
    subs = _submodels(field.annotation)
    if subs:
        suffix = subs[0][0]
        text += f" ([below](#{_anchor(path + suffix)}))"
    limits = [_limit(m) for m in field.metadata]
    limits = [x for x in limits if x]
    return text + (f", {', '.join(limits)}" if limits else "")


def _type(annotation: Any) -> str:
    """A type as a reader writes it in YAML terms: `float`, one of `a`, `b`, `list of RewardSpec`, or null."""
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        items = [a for a in args if a is not Ellipsis]
        return "list" + (f" of {_type(items[0])}" if len(items) == 1 else "")
    if origin is dict:
        return f"mapping of {_type(args[0])} to {_type(args[1])}" if len(args) == 2 else "mapping"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type):
        return f"`{annotation.__name__}`"
    return f"`{annotation}`"


def _limit(meta: Any) -> str:
    """A constraint from the field's metadata (pydantic's `ge=`, `min_length=`, ...) as text."""
    if isinstance(meta, annotated_types.Ge):
        return f">= {meta.ge}"
    if isinstance(meta, annotated_types.Gt):
        return f"> {meta.gt}"
    if isinstance(meta, annotated_types.Le):
        return f"<= {meta.le}"
    if isinstance(meta, annotated_types.Lt):
        return f"< {meta.lt}"
    if isinstance(meta, annotated_types.MinLen):
        return f"length >= {meta.min_length}"
    if isinstance(meta, annotated_types.MaxLen):
        return f"length <= {meta.max_length}"
    return ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "its section's defaults"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return f"`{json.dumps(to_jsonable_python(value))}`".replace("|", "\\|")


def _description(field: FieldInfo) -> str:
    text = _one_line(field.description or "")
    if field.json_schema_extra == UNKEYED:
        text = f"*unkeyed.* {text}".strip()
    return text


def _one_line(text: str) -> str:
    """Help text as one line of Markdown that reads as written: pipes escaped (a cell ends at one), and outside code
    spans the characters Markdown would take as emphasis, a link or an HTML tag (`learning_rate * decay**(r - 1)`,
    `[calculator]`, `<suite>/<metric>`)."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = re.sub(r"([\\*_\[\]])", r"\\\1", parts[i]).replace("<", "&lt;")
    return "`".join(parts).replace("|", "\\|")


def main(argv: list[str] | None = None) -> int:
    """Write the page to the path given, or print it."""
    args = sys.argv[1:] if argv is None else argv
    page = render()
    if args:
        Path(args[0]).write_text(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
