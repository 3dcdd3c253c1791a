"""Where the data stage's rows come from, and the contract they must meet. Shared with evaluation's benchmark files
and suites, so that no other module imports the data stage's own module for them.

sources/
  load.py        a configured source loaded into the standard columns (prompt, answer, completion)
  synthetic.py   the built-in synthetic tasks, deterministic by seed
  tool_tasks.py  a synthetic task that pays to use a tool (tool_arithmetic)
  tables.py      local JSONL/JSON/Parquet/CSV files and Hugging Face datasets, mapped to the standard columns
  contract.py    the data contract (pandera): the validate stage's check of the splits, and each eval suite's
"""

from __future__ import annotations


class DataError(ValueError):
    """The configured data cannot be loaded or mapped; the message names the file and column."""
