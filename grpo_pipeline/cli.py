"""Command line: `grpo-pipeline run --config configs/<recipe>.yaml [key.sub=value ...]`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, load_config
from grpo_pipeline.rewards_cli import rewards_app
from grpo_pipeline.runtime import configure_environment, configure_logging

app = typer.Typer(
    help="GRPO post-training as a Prefect pipeline: data -> validation -> SFT -> GRPO rounds -> eval -> MLflow.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
app.add_typer(rewards_app, name="rewards")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML recipe, e.g. configs/tiny-arith.yaml (defaults if omitted).")
]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Overrides as key.sub=value, e.g. grpo.learning_rate=5e-5 sft.enabled=false.")
]


def _load(config: Path | None, overrides: list[str] | None) -> PipelineConfig:
    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def print_summary(summary) -> None:
    stages = Table(title=f"grpo-pipeline: {summary.recipe} (config {summary.config_hash})")
    for col, justify in (("stage", "left"), ("wall time (s)", "right"), ("cached", "left")):
        stages.add_column(col, justify=justify)
    for s in summary.stages:
        stages.add_row(s.stage, f"{s.seconds:.1f}", "[green]yes[/green]" if s.cached else "no")
    stages.add_row("[bold]total[/bold]", f"{summary.total_seconds:.1f}", "")
    console.print(stages)

    settings = ", ".join(f"{k}={v}" for k, v in summary.eval_settings.items())
    scores = Table(title=f"held-out scores ({settings})")
    scores.add_column("model")
    for c in summary.score_columns():
        scores.add_column(c, justify="right")
    for row in summary.scores:
        scores.add_row(row.model, *(f"{v:.3f}" for v in row.metrics.values()))
    console.print(scores)

    if summary.registrations:
        reg = Table(title="MLflow model registry")
        for col in ("model", "version", "alias", "gating metric", "value", "previous champion"):
            reg.add_column(col)
        for r in summary.registrations:
            prev = "-" if r.previous_champion is None else f"v{r.previous_champion} ({r.previous_champion_value:.3f})"
            reg.add_row(r.model_name, r.version, r.alias, r.gating_metric, f"{r.gating_value:.3f}", prev)
        console.print(reg)


@app.command()
def run(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore cached stage results and rerun everything.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    summary_json: Annotated[
        Path | None, typer.Option("--summary-json", help="Also write the run summary as JSON to this file.")
    ] = None,
) -> None:
    """Run the whole pipeline on a recipe."""
    cfg = _load(config, overrides)
    configure_environment()
    if refresh:
        os.environ["PREFECT_TASKS_REFRESH_CACHE"] = "true"
    configure_logging(verbose)
    # Prefect reads its settings at import time, so the flow is imported only now.
    from grpo_pipeline.flows.grpo_pipeline import grpo_pipeline

    console.print(f"[bold]grpo-pipeline[/bold] recipe [cyan]{cfg.name}[/cyan], run dir [cyan]{cfg.run_dir}[/cyan]")
    try:
        summary = grpo_pipeline(config=cfg)
    except Exception as e:  # the flow has logged the traceback; end with one clear line and a non-zero code
        console.print(f"[red]pipeline failed:[/red] {type(e).__name__}: {e}")
        raise typer.Exit(1) from None
    print_summary(summary)
    if summary_json:
        summary_json.write_text(summary.model_dump_json(indent=2))
    console.print(f"MLflow UI: mlflow ui --backend-store-uri {os.environ.get('MLFLOW_TRACKING_URI')}")


@app.command("config")
def show_config(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the JSON schema with every field's help.")] = False,
) -> None:
    """Print the fully resolved config (YAML), or the schema of every field."""
    if schema:
        console.print_json(json.dumps(PipelineConfig.model_json_schema()))
        return
    console.print(_load(config, overrides).to_yaml(), highlight=False, markup=False)


if __name__ == "__main__":
    app()
