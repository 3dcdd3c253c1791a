"""A tool-using policy's episodes in words and tables, for the run summary (flows/summary_tables.py) and the model card
(tasks/release/card.py): both read `EvalResult.tools` (agents/episodes.py `episode_stats`, greedy and sampled)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# (reading, column heading, shown as a share): per episode, as `episode_stats` names them
READINGS = (
    ("call_frequency", "tool calls per problem", False),
    ("used_share", "episodes that called", True),
    ("failure_frequency", "failed calls (of calls)", True),
    ("turn_limit_share", "turn-limit hits (of episodes)", True),
    ("environment_reward", "environment reward (mean)", False),  # only where an environment scored its episodes
)
PREFIX = "tools/"


def is_tool_metric(name: str) -> bool:
    """Whether a metric of `EvalResult.metrics()` is a tool reading (shown in its own table, not among the scores)."""
    return name.startswith(PREFIX)


def _cell(tools: Mapping[str, float], reading: str, share: bool) -> str:
    values = [tools.get(f"{PREFIX}{run}_{reading}") for run in ("greedy", "sampled")]
    return " / ".join("-" if v is None else f"{v:.0%}" if share else f"{v:.2f}" for v in values)


def tool_use_table(rows: Sequence[tuple[str, Mapping[str, float]]]) -> list[str]:
    """A markdown table, one row per model that ran tool episodes: each reading as `greedy / sampled`; [] when none
    did."""
    rows = [(model, tools) for model, tools in rows if tools]
    if not rows:
        return []
    shown = [(r, h, s) for r, h, s in READINGS if r != "environment_reward" or _any_reading(rows, r)]
    lines = [
        "| model | " + " | ".join(heading for _, heading, _ in shown) + " |",
        "|---|" + "---:|" * len(shown),
    ]
    lines += [f"| {model} | " + " | ".join(_cell(tools, r, s) for r, _, s in shown) + " |" for model, tools in rows]
    return lines


def _any_reading(rows: Sequence[tuple[str, Mapping[str, float]]], reading: str) -> bool:
    return any(f"{PREFIX}{run}_{reading}" in tools for _, tools in rows for run in ("greedy", "sampled"))


def tool_use_lines(rows: Sequence[tuple[str, Mapping[str, float]]]) -> list[str]:
    """The tool-use table with the line that says how to read it; [] without tool episodes."""
    table = tool_use_table(rows)
    if not table:
        return []
    return [
        "",
        "Tool use (greedy / sampled episodes; a turn-limit hit is an episode still calling when its turns were spent):",
        "",
        *table,
    ]
