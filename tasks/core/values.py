"""What counts as a missing value in a table cell, one rule for every reader of data (tasks/sources, the eval
adapters in tasks/scoring, the code formats in rewards/code_formats).

pandas marks an absent cell as None (object columns), NaN (float columns, an empty CSV cell, a JSONL row without
the key) or pandas.NA / NaT (nullable and datetime dtypes); `is_missing` is true for exactly these. `is_blank` adds
the strings with nothing but whitespace, for a cell whose text is needed (a prompt, a test, an entry point).
"""

from __future__ import annotations

from typing import Any


def is_missing(value: Any) -> bool:
    """None, NaN, pandas.NA or NaT: a cell pandas reads as absent. A string, even empty, is a value."""
    if value is None or type(value).__name__ in ("NAType", "NaTType"):  # by name: no pandas import here
        return True
    return isinstance(value, float) and value != value


def is_blank(value: Any) -> bool:
    """A missing value (`is_missing`) or a string of whitespace only."""
    return is_missing(value) or (isinstance(value, str) and not value.strip())
