"""Command line: `grpo-pipeline run --config configs/<recipe>.yaml [key.sub=value ...]`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markdown import Markdown

from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, load_config
from grpo_pipeline.rewards_cli import rewards_app
from grpo_pipeline.runtime import setup

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


@app.command()
def run(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Ignore cached stage results and rerun everything.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    summary_json: Annotated[
        Path | None, typer.Option("--summary-json", help="Also write the run summary as JSON to this file.")
    ] = None,
) -> None:
    """Run the whole pipeline on a recipe."""
    cfg = _load(config, overrides)
    setup(cfg, verbose=verbose, refresh=refresh)
    # Prefect reads its settings at import time, so the flow is imported only after setup.
    from grpo_pipeline.flows.grpo_pipeline import grpo_pipeline
    from grpo_pipeline.tasks.tracking import tracking_uri

    console.print(f"[bold]grpo-pipeline[/bold] recipe [cyan]{cfg.name}[/cyan], run dir [cyan]{cfg.run_dir}[/cyan]")
    try:
        summary = grpo_pipeline(config=cfg)
    except Exception as e:  # the flow has logged the traceback; end with one clear line and a non-zero code
        console.print(f"[red]pipeline failed:[/red] {type(e).__name__}: {e}")
        raise typer.Exit(1) from None
    console.print(Markdown(summary.to_markdown()))
    if summary_json:
        summary_json.write_text(summary.model_dump_json(indent=2))
    console.print(f"MLflow UI: mlflow ui --backend-store-uri {tracking_uri(cfg.run_dir)}")


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
