"""What every stage stands on: the floor of the `tasks` package, which imports nothing above it but the config.

core/
  stage.py        one key per stage: Prefect's cache key and the output folder, from inputs, code and user code
  common.py       Ref, Checkpoint and DatasetRefs (paths plus content fingerprints), atomic writes, the logger
  runtime.py      the process defaults (Prefect's settings, logging, warnings, import paths) every entry point applies
  tracking.py     MLflow: the tracking URI, runs, a reachable server, the registry lock
  chat.py         chat prompts: messages stored in the data, rendered with the model's chat template
  context_window.py  prompts and what follows them (rollouts, eval completions, SFT targets) against the context
  hub.py          Hugging Face Hub models and datasets: offline, unreachable, not there; local model paths
  python_ast.py   `ast.parse` that holds when other threads parse at the same time
  jobs.py         a stage call as data (module, stage, arguments), rebuilt in another process
  launch.py       a stage run in N processes (accelerate launch / torchrun), or as a Ray Train job
  ray_launch.py   a training stage as a Ray Train job
  ray_tasks.py    a stage as one Ray task (the evaluation suites' fan-out)
  ray_cluster.py  what both Ray ways share: the cluster, inputs published for workers, a worker's start-up
  publish.py      a round's inputs shared with, and its policy fetched from, a remote work pool
  values.py       what counts as a missing value in a table cell (None, NaN, pandas.NA) and a blank one
"""
