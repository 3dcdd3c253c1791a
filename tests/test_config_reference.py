"""The configuration reference in docs/ is generated from the config schema and kept in step with it."""

import re
import typing
from pathlib import Path

from pydantic import BaseModel
from typer.testing import CliRunner

from grpo_pipeline.cli import app
from grpo_pipeline.configs.reference import REGENERATE, render
from grpo_pipeline.configs.schema import EvalSuiteConfig, PipelineConfig, RewardSpec

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration-reference.md"


def test_the_checked_in_reference_matches_the_schema():
    assert PAGE.read_text() == render(), (
        f"docs/configuration-reference.md is out of date with the config schema; regenerate it with `{REGENERATE}`"
    )


def _leaf_paths(model: type[BaseModel], path: str = "") -> list[str]:
    """Every field's dotted name, a list of sections as `name[]` (as the reference names them)."""
    paths = []
    for name, field in model.model_fields.items():
        dotted = f"{path}.{name}" if path else name
        paths.append(dotted)
        annotation = field.annotation
        if typing.get_origin(annotation) is list:
            (item,) = typing.get_args(annotation)
            if item in (RewardSpec, EvalSuiteConfig):
                paths += _leaf_paths(item, dotted + "[]")
            continue
        for arg in (annotation, *typing.get_args(annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                paths += _leaf_paths(arg, dotted)
    return paths


def test_the_reference_has_a_row_for_every_field_with_its_help():
    page = render()
    rows = dict(re.findall(r"^\| `([^`]+)` \|.*?\| ([^|]*) \|$", page, re.MULTILINE))
    paths = _leaf_paths(PipelineConfig)
    assert "grpo.difficulty_filter.max_pass_rate" in paths and "eval.suites[].hf_name" in paths
    missing = [p for p in paths if p not in rows]
    assert not missing, f"fields without a row: {missing}"
    assert "Peak learning rate." in page.split("`grpo.learning_rate`")[1].splitlines()[0]
    assert "| `grpo.generations_per_prompt` | `int`, >= 2 | `8` |" in page
    assert "| `grpo.save_every_steps` | `int`, >= 0 | `50` | *unkeyed.*" in page


def test_the_cli_prints_the_reference():
    result = CliRunner().invoke(app, ["config", "--reference"])
    assert result.exit_code == 0, result.output
    assert result.output == render()
