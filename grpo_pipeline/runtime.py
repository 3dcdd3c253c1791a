"""Process-wide defaults that must be in place before Prefect is imported: offline, project-local state."""

from __future__ import annotations

import logging
import os
from pathlib import Path

DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # The ephemeral server starts in ~10 s on an idle laptop; leave room for a busy 2-core machine.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
}


def configure_environment(project_dir: str | Path = ".") -> None:
    """Set offline, project-local defaults for Prefect and friends; values already in the environment win.

    With no PREFECT_API_URL, Prefect runs a temporary local server per run; its database and cached results live
    under PREFECT_HOME, here `<project>/.prefect`, so caching works across runs of the same project.
    """
    os.environ.setdefault("PREFECT_HOME", str(Path(project_dir).resolve() / ".prefect"))
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def configure_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "alembic", "mlflow.store", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Keep the trainers' step progress bars; drop the per-file loading/writing/mapping bars.
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
