"""Prefect flows.

    flows/
      grpo_pipeline.py  the pipeline DAG, top to bottom: the flow, its body (run_stages) and the report it publishes
      inputs.py         what the rounds train and are scored on: the data and every suite's rows, decontaminated
      rounds.py         the training loop and its release: the GRPO rounds (or a recipe's stages), each evaluated and
                        registered; grpo_round(...) is one GRPO round's steps
      stages.py         the stages as Prefect tasks (cache keys, retries) and `Stages`, which runs and records them
      grpo_train.py     one GRPO round as its own deployable flow (grpo-train), for another work pool
      summary.py        the end-of-run summary: one record per stage run and per round
      summary_tables.py the summary shown: Markdown tables that fit a console, the log's headline, the score table

Importing this package applies the process's environment defaults (grpo_pipeline.tasks.core.runtime) before Prefect
is imported, so a flow called from plain Python starts its temporary server with the same settings as the CLI.
"""

from grpo_pipeline.tasks.core.runtime import apply_env_defaults

apply_env_defaults()
