"""What every stage stands on.

core/
  stage.py     one key per stage: Prefect's cache key and the output folder, from inputs, code and user code
  common.py    Ref and Checkpoint (paths plus content fingerprints), atomic writes, the logger
  tracking.py  MLflow: the tracking URI, runs, a reachable server, the registry lock
  launch.py    a stage run in N processes (accelerate launch / torchrun)
  publish.py   a round's inputs shared with, and its policy fetched from, a remote work pool
  hub.py       Hugging Face Hub models and datasets: offline, unreachable, not there
  values.py    what counts as a missing value in a table cell (None, NaN, pandas.NA) and a blank one
"""
