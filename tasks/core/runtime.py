"""One way in: the process defaults that the CLI, the flow (so a Prefect worker gets them), tests and plain Python
all apply through `setup`.

Settings that Prefect reads at import time (PREFECT_HOME, analytics, the ephemeral server's start-up timeout, extra
loggers) only take effect before Prefect is imported: the CLI calls `setup` first thing, and importing
`grpo_pipeline.flows` applies the environment defaults before it imports Prefect. The flow calls `setup` again on
entry, which sets logging and the import paths of the user's own modules.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_pipeline.configs.schema import PipelineConfig

DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # The ephemeral server starts in ~10 s on an idle laptop; leave room for a busy 2-core machine.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # The stages' own log lines (scores, registrations, warnings) go to the Prefect run logs too.
    "PREFECT_LOGGING_EXTRA_LOGGERS": "grpo_pipeline",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # Keep the trainers' step progress bars; drop the per-file loading/writing/mapping bars of datasets and the hub.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
}
QUIET_LOGGERS = ("httpx", "urllib3", "alembic", "mlflow.store", "filelock")
# Set by `setup(verbose=True)`, so that the flow's own `setup()` and the processes of a multi-process launch
# (tasks/core/launch.py) stay verbose too.
VERBOSE_ENV = "GRPO_PIPELINE_VERBOSE"
# Warnings that the libraries raise about their own calls, silenced by exact message and raising module (never a
# blanket ignore); `-v` shows them again. Where ours were the cause, the call is fixed instead: the trainers get
# transformers 5's `activation_checkpointing` (tasks/training/trainer.py) and no pinned memory without CUDA.
LIBRARY_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # TRL 1.16 turns checkpointing off around each GRPO generation (trl/models/utils.py,
    # disable_gradient_checkpointing) through the names transformers 5 renamed to activation_checkpointing*.
    (
        FutureWarning,
        r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated "
        r"and will be removed in v6\.",
        r"transformers\.modeling_utils$",
    ),
)


def setup(config: PipelineConfig | None = None, *, verbose: bool | None = None, refresh: bool = False) -> None:
    """Apply every process default; values already in the environment win. Safe to call more than once.

    - Prefect: project-local state under `./.prefect` (PREFECT_HOME), analytics off, our logger in the run logs.
      With no PREFECT_API_URL, Prefect runs a temporary local server per run whose database and cached results
      live under PREFECT_HOME, so caching works across runs of the same project.
    - `refresh`: every stage reruns (Prefect ignores cached results but still writes new ones).
    - Logging for the pipeline's own logger, libraries' chatter turned down (their log levels, and the deprecation
      warnings in LIBRARY_WARNINGS). `verbose` (the CLI's `-v`): DEBUG and every warning; it stays on for the rest
      of the process and the processes it starts, so `verbose=None` (the default) means "as set before".
    - Import paths: the recipe's directory (`config.code_dir`), then the working directory, so a user's reward
      module beside the recipe imports by its dotted path without PYTHONPATH. The project's own source root is never
      one of them (see `add_import_paths`).
    """
    apply_env_defaults()
    if refresh:
        os.environ["PREFECT_TASKS_REFRESH_CACHE"] = "true"
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    verbose = os.environ.get(VERBOSE_ENV) == "1"
    configure_logging(verbose)
    configure_warnings(verbose)
    add_import_paths(config.code_dir if config is not None else None, Path.cwd())


def apply_env_defaults() -> None:
    """The environment part of `setup` (values already set win). `grpo_pipeline.flows` applies it on import,
    before Prefect is imported, so that a flow called from plain Python gets Prefect's import-time settings too."""
    os.environ.setdefault("PREFECT_HOME", str(Path.cwd() / ".prefect"))
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def configure_logging(verbose: bool = False) -> None:
    """INFO (DEBUG with `verbose`) to stderr unless the host (Prefect, pytest, a notebook) set up logging already."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("grpo_pipeline").setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def configure_warnings(verbose: bool = False) -> None:
    """Silence the libraries' own deprecation warnings in LIBRARY_WARNINGS, or with `verbose` show them again."""
    ours = {message for _, message, _ in LIBRARY_WARNINGS}
    # `filters` entries are (action, message regex, category, module regex, lineno); drop ours, then add them anew.
    # An ignored warning leaves nothing in the modules' warning registries, so dropping the entries is enough.
    warnings.filters[:] = [f for f in warnings.filters if not (f[1] is not None and f[1].pattern in ours)]
    if verbose:
        return
    for category, message, module in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def add_import_paths(*dirs: str | Path | None) -> None:
    """Put `dirs` at the front of sys.path, in the order given, as Python does for a script's own directory, each once.

    The project's source root (a checkout, whose configs/, flows/, tasks/ and rewards/ folders are installed as
    `grpo_pipeline.configs`, ...) is skipped, and moved to the end where it is on sys.path already (`python -m` or a
    Prefect worker started there, pytest's rootdir): on the path its folders import under their bare names too, and
    a user's own `rewards.py` or `tasks.py` beside the recipe would then lose to them."""
    roots = source_roots()
    wanted = [str(Path(d).resolve()) for d in dirs if d]
    for d in reversed([d for d in dict.fromkeys(wanted) if Path(d) not in roots]):
        if d in sys.path:
            sys.path.remove(d)
        sys.path.insert(0, d)
    cwd = Path.cwd()
    for entry in [e for e in sys.path if Path(e or cwd).resolve() in roots]:
        sys.path.remove(entry)
        sys.path.append(entry)


def source_roots() -> set[Path]:
    """The directories that hold the design folders mapped into `grpo_pipeline` (the checkout of an editable
    install; for a regular install, the installed package's own directory, which is never on sys.path)."""
    from importlib.util import find_spec

    roots = set()
    for name in ("configs", "flows", "tasks", "rewards", "agents"):
        spec = find_spec(f"grpo_pipeline.{name}")  # the subpackage's location, without importing it
        for location in (spec.submodule_search_locations or []) if spec else []:
            roots.add(Path(location).resolve().parent)
    return roots
