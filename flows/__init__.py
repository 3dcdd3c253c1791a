"""Prefect flows: the pipeline DAG (grpo_pipeline.py) and one GRPO round as its own flow (grpo_train.py).

Importing this package applies the process's environment defaults (grpo_pipeline.runtime) before Prefect is
imported, so a flow called from plain Python starts its temporary server with the same settings as the CLI.
"""

from grpo_pipeline.runtime import apply_env_defaults

apply_env_defaults()
