"""`grpo-pipeline serve-model models:/<name>@<alias>`: MLflow's scoring server for a registered version, started so
that it works from any shell, the venv activated or not.

`mlflow models serve --env-manager local` starts the server by running `uvicorn` from PATH
(mlflow/pyfunc/scoring_server `get_cmd`); from a shell that did not activate the virtual environment there is none,
and the command ends with exit code 127. This command runs the same `mlflow models serve` with this interpreter's
bin directory first on PATH and the tracking URI of the registry that holds the model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from grpo_pipeline.tasks.core.tracking import tracking_uri as run_tracking_uri

# The commands import the pipeline's modules inside their bodies, not here: `--help` and the quick commands start
# without loading Prefect, torch or MLflow, and `setup()` applies Prefect's import-time settings first
# (tasks/core/runtime.py).

console = Console(stderr=True)


def serve_model_command(
    model_uri: Annotated[str, typer.Argument(help="The model to serve: models:/<name>@<alias> or models:/<name>/<n>.")],
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = 5001,
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind (127.0.0.1: this machine only).")
    ] = "127.0.0.1",
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="The run directory whose MLflow store holds the registry.")
    ] = Path("runs"),
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            help="MLflow tracking URI of the registry (default: MLFLOW_TRACKING_URI, else "
            "the SQLite store under --run-dir).",
        ),
    ] = None,
) -> None:
    """Serve a registered model over HTTP (POST /invocations), as `mlflow models serve --env-manager local`."""

    uri = tracking_uri or run_tracking_uri(run_dir)
    problem = registry_problem(model_uri, uri)
    if problem:
        console.print(f"[red]error:[/red] {escape(problem)}", soft_wrap=True)
        raise typer.Exit(2)
    argv, env = serve_command(model_uri, uri, host, port)
    console.print(f"serving {model_uri} (registry {uri}) at http://{host}:{port}/invocations", soft_wrap=True)
    sys.stderr.flush()
    os.execve(argv[0], argv, env)  # MLflow's server takes this process over: Ctrl-C and signals reach it directly


def serve_command(model_uri: str, uri: str, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The `mlflow models serve` command line and its environment: this interpreter's bin directory (where uvicorn
    is installed) first on PATH, and MLFLOW_TRACKING_URI set to the registry's URI."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    env["PATH"] = os.pathsep.join([bin_dir, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir]])
    argv = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
    return [*argv, "--host", host, "--port", str(port)], env


def registry_problem(model_uri: str, uri: str) -> str | None:
    """Why `model_uri` (a models:/ URI) cannot be served from the registry at `uri`, or None; other URIs pass."""
    if not model_uri.startswith("models:/"):
        return None
    name, _, version = model_uri.removeprefix("models:/").partition("/")
    name, _, alias = name.partition("@")
    fix = "pass --run-dir (or --tracking-uri) of the run that registered it"
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return f"{model_uri}: there is no MLflow store at {uri}; {fix}"  # MLflow would create an empty one
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        if alias:
            client.get_model_version_by_alias(name, alias)
        elif version.isdigit():
            client.get_model_version(name, version)
        else:
            client.get_registered_model(name)
    except MlflowException as e:
        return f"{model_uri} is not in the registry at {uri} ({e.message}); {fix}, or name a version it holds"
    return None
