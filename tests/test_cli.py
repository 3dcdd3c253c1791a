import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from grpo_pipeline.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "run" in result.output and "config" in result.output
    result = runner.invoke(app, ["run", "--help"])
    assert result.exit_code == 0 and "--refresh" in result.output and "key.sub=value" in result.output


def test_config_prints_resolved_yaml_with_overrides():
    result = runner.invoke(app, ["config", "--config", str(ROOT / "configs/tiny-arith.yaml"), "grpo.beta=0.04"])
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.output)
    assert resolved["grpo"]["beta"] == 0.04 and resolved["name"] == "tiny-arith"


def test_bad_config_exits_2_with_field_names():
    result = runner.invoke(app, ["run", "--config", str(ROOT / "configs/tiny-arith.yaml"), "grpo.lr=3", "sft.epochs=0"])
    assert result.exit_code == 2
    assert "grpo.lr" in result.output and "unknown field" in result.output
    assert "sft.epochs" in result.output


def test_importing_the_flow_loads_no_training_library():
    """A fully cached run never trains, so it must not pay for importing torch, transformers, TRL or MLflow."""
    code = (
        "import sys, grpo_pipeline.cli, grpo_pipeline.flows.grpo_pipeline; "
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'mlflow', 'datasets', 'matplotlib') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_stacks_database_urls_get_their_driver_and_never_show_their_password():
    from grpo_pipeline.stack import StackError, database_url, redacted

    url = "postgresql://grpo:s3cret@db:5432/prefect"
    assert database_url(url, "prefect") == "postgresql+asyncpg://grpo:s3cret@db:5432/prefect"
    assert database_url("postgresql+psycopg2://grpo@db/mlflow", "mlflow") == "postgresql+psycopg://grpo@db/mlflow"
    assert database_url(None, "mlflow") is None  # SQLite under the state directory
    assert redacted(url) == "postgresql://grpo:***@db:5432/prefect" and redacted("postgresql://grpo@db/x").endswith(
        "@db/x"
    )
    with pytest.raises(StackError, match=r"GRPO_PIPELINE_MLFLOW_DB\) is not a PostgreSQL URL") as err:
        database_url("mysql://grpo:s3cret@db/mlflow", "mlflow")
    assert "s3cret" not in str(err.value)
