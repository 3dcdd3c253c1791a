"""A staged recipe's stage x suite matrix (configs/stages.py): the policy each stage ended with, scored by the recipe's
gating metric on every eval suite, and its change against the row before it (what the stage added, and what it cost).
The run summary shows it, and so does the model card of every version a stage registers (tasks/release/card.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from grpo_pipeline.tasks.scoring.results import EvalResult


class StageRow(BaseModel):
    """A row of the matrix: the policy a stage ended with (its last new round; the start for the first row) and the
    recipe's gating metric on every suite."""

    stage: str  # the stage's name ("" for the policy the stages started from)
    model: str
    values: dict[str, float | None]  # by suite; None where the suite does not score the metric
    kept: bool | None = None  # whether the gate kept the stage (took champion); None for the start, or undecided

    @classmethod
    def of(
        cls, stage: str, model: str, scores: dict[str, EvalResult], metric: str, suites: Sequence[str], **kw: bool
    ) -> StageRow:
        """The row of the policy scored `scores` (by suite name): `metric` on each of `suites`."""
        values = {name: scores[name].metrics().get(metric) if name in scores else None for name in suites}
        return cls(stage=stage, model=model, values=values, **kw)


def matrix_lines(rows: Sequence[StageRow]) -> list[str]:
    """The stage x suite matrix as a Markdown table: each stage's policy on every suite, with its change against the
    row before it."""
    suites = list(rows[0].values)
    lines = [
        "Stages (the gating metric on every suite; change against the row before):",
        "",
        f"| stage | model | {' | '.join(suites)} | kept |",
        f"|---|---|{'---:|' * len(suites)}---|",
    ]
    for before, row in zip([None, *rows], rows, strict=False):
        cells = []
        for suite, value in row.values.items():
            was = before.values.get(suite) if before else None
            change = f" ({value - was:+.3f})" if value is not None and was is not None else ""
            cells.append("-" if value is None else f"{value:.3f}{change}")
        kept = "" if row.kept is None else ("yes" if row.kept else "**no**")
        lines.append(f"| {row.stage or 'start'} | {row.model} | {' | '.join(cells)} | {kept} |")
    return lines
