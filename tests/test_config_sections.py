"""The config split into one module per section: the YAML schema, the recipes and the override errors it keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from grpo_pipeline.cli import app
from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, apply_overrides, load_config

ROOT = Path(__file__).resolve().parents[1]
# Every field of PipelineConfig with its type, constraints, default and unkeyed mark (help texts and class names
# left out). Written when configs/schema.py was split by section, and rewritten only by a change that means to add or
# change a field, so that no refactoring changes the config by accident.
EXPECTED_SHAPE = Path(__file__).parent / "golden" / "pipeline_config_shape.json"
# The default config as `grpo-pipeline config` prints it: every field with its value (rewritten the same way).
EXPECTED_DEFAULTS = Path(__file__).parent / "golden" / "pipeline_config_defaults.yaml"


def config_shape(node: Any, defs: dict[str, Any] | None = None) -> Any:
    """A JSON schema with every `$ref` inlined and the prose (titles, descriptions) left out."""
    if defs is None:
        defs = node.get("$defs", {})
    if isinstance(node, list):
        return [config_shape(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return config_shape(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    skip = {"title", "description", "$defs"}
    return {
        k: config_shape(v, defs) if k != "properties" else _properties(v, defs)
        for k, v in node.items()
        if k not in skip
    }


def _properties(props: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    return {name: config_shape(field, defs) for name, field in props.items()}


@pytest.mark.parametrize("recipe", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads(recipe):
    assert isinstance(load_config(recipe), PipelineConfig)


def test_fields_and_defaults_match_the_golden_shape():
    expected = json.loads(EXPECTED_SHAPE.read_text())
    assert config_shape(PipelineConfig.model_json_schema()) == expected


def test_default_config_matches_the_golden_defaults():
    # Parsed, not as text: the grpo section's fields were regrouped under headings, so they print in a new order.
    resolved = yaml.safe_load(load_config(None).to_yaml())
    resolved.pop("code_dir")  # where the recipe was found, None for the defaults
    expected = yaml.safe_load(EXPECTED_DEFAULTS.read_text())
    expected.pop("code_dir")
    assert resolved == expected
    assert list(resolved) == list(expected)  # the sections, in their order


# A shell quoting slip splits `grpo.rewards=[{name: correctness}]` at the space; a missing bracket cuts a list short.
MALFORMED = [
    ("data.num_train=[1,", "column 4"),
    ("grpo.rewards=[{name:", "column 8"),
    ("data.prompt_template={x", "column 3"),
    ('data.system_prompt="Add the numbers.', "column 18"),
]


@pytest.mark.parametrize(("override", "position"), MALFORMED)
def test_malformed_override_value_is_a_config_error_naming_it(override, position):
    with pytest.raises(ConfigError) as err:
        apply_overrides({}, [override])
    message = str(err.value)
    assert repr(override) in message and "not valid YAML" in message and position in message
    assert "\n" not in message


@pytest.mark.parametrize("command", ["config", "run"])
@pytest.mark.parametrize(("override", "position"), MALFORMED[:2])
def test_malformed_override_through_the_cli_is_one_line_and_exit_2(command, override, position):
    result = CliRunner().invoke(app, [command, override, "correctness}]"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: override ") and position in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "Traceback" not in result.output and "ParserError" not in result.output
