"""Command line: `grpo-pipeline run --config configs/<recipe>.yaml [key.sub=value ...]`."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape

from grpo_pipeline import stack
from grpo_pipeline.configs import reference as config_reference
from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, load_config
from grpo_pipeline.eval_cli import eval_command
from grpo_pipeline.rehearse import rehearsal_config
from grpo_pipeline.rewards_cli import rewards_app
from grpo_pipeline.serve_model import serve_model_command
from grpo_pipeline.tasks.core.runtime import setup, source_roots
from grpo_pipeline.tasks.core.tracking import tracking_uri

# The commands import the pipeline's modules inside their bodies, not here: `--help` and the quick commands start
# without loading Prefect, torch or MLflow, and `setup()` applies Prefect's import-time settings first
# (tasks/core/runtime.py).

app = typer.Typer(
    help="GRPO post-training as a Prefect pipeline: data -> validation -> SFT -> GRPO rounds -> eval -> MLflow.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
app.add_typer(rewards_app, name="rewards")
app.command(name="eval")(eval_command)
app.command(name="serve-model")(serve_model_command)

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
        _error(e)
        raise typer.Exit(2) from None


def _error(e: Exception) -> None:
    """One clear message: the error's own text (it says what, where and how to fix), no traceback."""
    console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)


def _preflight(cfg: PipelineConfig) -> None:
    """The checks that need no data (run dir, rewards, base model path), before Prefect starts: exit 2 on failure."""
    from grpo_pipeline.tasks.preflight import PreflightError, check_config

    try:
        check_config(cfg)
    except PreflightError as e:
        _error(e)
        raise typer.Exit(2) from None


class _NoTracebackFor(logging.Filter):
    """Drop the traceback from Prefect's failure records of these exception types (the message stays): a bad input
    is the user's to fix, and a hundred lines of engine frames would bury the one line that says how."""

    def __init__(self, types: tuple[type[BaseException], ...]):
        super().__init__()
        self.types = types

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], self.types):
            record.exc_info, record.exc_text = None, None
        return True


RefreshOpt = Annotated[bool, typer.Option("--refresh", help="Ignore cached stage results and rerun everything.")]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Debug logging, trainer log dicts, libraries' deprecation warnings.")
]
SummaryOpt = Annotated[
    Path | None, typer.Option("--summary-json", help="Also write the run summary as JSON to this file.")
]


@app.command()
def run(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    refresh: RefreshOpt = False,
    verbose: VerboseOpt = False,
    summary_json: SummaryOpt = None,
) -> None:
    """Run the whole pipeline on a recipe."""
    cfg = _load(config, overrides)
    setup(cfg, verbose=verbose, refresh=refresh)
    _run_pipeline(cfg, verbose, summary_json)


@app.command()
def rehearse(
    config: Annotated[
        Path, typer.Option("--config", "-c", help="The recipe to rehearse, e.g. configs/qwen2.5-0.5b-gsm8k.yaml.")
    ],
    overrides: OverridesArg = None,
    refresh: RefreshOpt = False,
    verbose: VerboseOpt = False,
    summary_json: SummaryOpt = None,
) -> None:
    """Rehearse a GPU recipe on this machine's CPU in minutes: its whole DAG on a tiny model of the same family, its
    own data (hub data: data.source=file data.path=<local copy>), rewards, metrics, gate and registration (under
    <model_name>-rehearsal), so every error that does not need a GPU shows before a GPU is paid for. The summary
    says what was changed and what could not be rehearsed."""

    cfg = _load(config, overrides)
    setup(cfg, verbose=verbose, refresh=refresh)
    try:
        cfg = rehearsal_config(cfg)
    except ConfigError as e:
        _error(e)
        raise typer.Exit(2) from None
    console.print(f"[bold]rehearsal[/bold] of {cfg.rehearsal.recipe}: " + "; ".join(cfg.rehearsal.not_rehearsed))
    _run_pipeline(cfg, verbose, summary_json)


def _run_pipeline(cfg: PipelineConfig, verbose: bool, summary_json: Path | None) -> None:
    """The flow on `cfg` (after `setup`), its summary printed, and where to see it in MLflow."""
    _preflight(cfg)
    _use_stack_if_running()
    # Prefect reads its settings at import time, so the flow is imported only after setup.
    from grpo_pipeline.flows.grpo_pipeline import grpo_pipeline
    from grpo_pipeline.flows.stages import BAD_INPUT
    from grpo_pipeline.flows.summary_tables import as_markdown

    if not verbose:
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).addFilter(_NoTracebackFor(BAD_INPUT))
    console.print(f"[bold]grpo-pipeline[/bold] recipe [cyan]{cfg.name}[/cyan], run dir [cyan]{cfg.run_dir}[/cyan]")
    try:
        summary = grpo_pipeline(config=cfg)
    except BAD_INPUT as e:  # the user's to fix: its message, without the traceback (--verbose keeps it)
        _error(e)
        raise typer.Exit(1) from None
    except Exception as e:  # the flow has logged the traceback; end with one clear line and a non-zero code
        console.print(f"[red]pipeline failed:[/red] {type(e).__name__}: {e}")
        raise typer.Exit(1) from None
    console.print(Markdown(as_markdown(summary, width=console.width)))  # tables laid out to fit, no header cut
    if summary_json:
        summary_json.write_text(summary.model_dump_json(indent=2))
    uri = tracking_uri(cfg.run_dir)
    # MLflow 3 opens in its GenAI view unless the link asks for the model-training one.
    page = f"#/models/{cfg.registry.model_name}?workflowType=machine_learning"
    if uri.startswith("http"):
        console.print(f"MLflow UI: {uri}/{page}", soft_wrap=True)
    else:
        local = f"mlflow ui --backend-store-uri {uri}, then http://127.0.0.1:5000/{page}"
        console.print(f"MLflow UI: {local}", soft_wrap=True)


def _use_stack_if_running() -> None:
    """Point Prefect and MLflow at the stack `grpo-pipeline serve` started, if it is up; say which is used."""
    if os.environ.get("PREFECT_API_URL"):
        console.print(f"Prefect server: {os.environ['PREFECT_API_URL']} (PREFECT_API_URL)")
        return
    running = stack.running()
    if running is None:
        console.print("Prefect server: a temporary one for this run (start a lasting stack with `grpo-pipeline serve`)")
        return
    for key, value in running.client_env().items():
        os.environ.setdefault(key, value)
    console.print(f"Prefect server: the running stack, UI {running.prefect_ui_url}; MLflow UI {running.mlflow_url}")


StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where the stack keeps its state, logs and stores (default .grpo-stack, or GRPO_PIPELINE_STACK_DIR).",
    ),
]


@app.command()
def serve(
    state_dir: StateDirOpt = None,
    prefect_port: Annotated[int, typer.Option(help="Prefect server port on 127.0.0.1 (0: any free port).")] = 4200,
    mlflow_port: Annotated[int, typer.Option(help="MLflow server port on 127.0.0.1 (0: any free port).")] = 5000,
    prefect_db: Annotated[
        str | None,
        typer.Option(
            help="PostgreSQL URL (postgresql://user:password@host:port/db) for the Prefect server's records; default: "
            "$PREFECT_SERVER_DATABASE_CONNECTION_URL, else SQLite in the state directory."
        ),
    ] = None,
    mlflow_db: Annotated[
        str | None,
        typer.Option(
            help="PostgreSQL URL for the MLflow tracking server's runs and registry; default: "
            "$GRPO_PIPELINE_MLFLOW_DB, else SQLite in the state directory. Artifacts stay in the state directory, "
            "served over HTTP."
        ),
    ] = None,
) -> None:
    """Start the stack in the background: Prefect and MLflow servers, work pools, deployments, workers."""
    with console.status("starting the Prefect server, the MLflow server, work pools, deployments and workers"):
        try:
            started = stack.serve(
                state_dir,
                prefect_port=prefect_port,
                mlflow_port=mlflow_port,
                prefect_db=prefect_db,
                mlflow_db=mlflow_db,
            )
        except stack.StackError as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(1) from None
    console.print("[green]the stack is up[/green]")
    for line in stack.status_lines(started):
        console.print(line)
    console.print(
        "run a deployment: prefect deployment run grpo-pipeline/local (with PREFECT_API_URL set), or "
        "grpo-pipeline run, which uses this stack; stop it with grpo-pipeline stop"
    )


@app.command()
def stop(state_dir: StateDirOpt = None) -> None:
    """Stop exactly what `serve` started."""
    stopped = stack.stop(state_dir)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def status(
    state_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Say what of the stack is running, with the UI addresses."""
    recorded = stack.load(state_dir)
    if as_json:
        # plain JSON on stdout: no markup, highlighting or wrapping, so it parses as it is
        console.print(stack.summary_json(recorded) if recorded else "{}", markup=False, highlight=False, soft_wrap=True)
        return
    for line in stack.status_lines(recorded):
        console.print(line)


@app.command("config")
def show_config(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    schema: Annotated[bool, typer.Option("--schema", help="Print the JSON schema with every field's help.")] = False,
    reference: Annotated[
        bool, typer.Option("--reference", help="Print the configuration reference (Markdown, docs/).")
    ] = False,
) -> None:
    """Print the fully resolved config (YAML), or the schema of every field, or the reference page made from it."""
    if schema:
        console.print_json(json.dumps(PipelineConfig.model_json_schema()))
        return
    if reference:
        typer.echo(config_reference.render(), nl=False)
        return
    console.print(_load(config, overrides).to_yaml(), highlight=False, markup=False)


if __name__ == "__main__":
    # `python -m grpo_pipeline.cli` puts the working directory first on sys.path; from a checkout that would make
    # its design folders (rewards/, tasks/, ...) importable under their bare names, ahead of a user's own modules.
    roots = source_roots()
    sys.path[:] = [e for e in sys.path if Path(e or os.getcwd()).resolve() not in roots]
    app()
