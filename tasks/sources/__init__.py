"""Where the data stage's rows come from: the built-in synthetic tasks (`synthetic`) and local files and Hugging
Face datasets mapped to the standard columns (`tables`). Shared with evaluation's benchmark files and the Hub
helpers, so that no other module imports the data stage's own module for them."""

from __future__ import annotations


class DataError(ValueError):
    """The configured data cannot be loaded or mapped; the message names the file and column."""
