"""The `rehearsal:` section, set by `grpo-pipeline rehearse` (grpo_pipeline/rehearse.py) and never by hand: which
recipe a run rehearses, what the rehearsal changed, and what it could not rehearse. The summary and the model card
carry it, so a rehearsal's numbers are never read as the recipe's. Unkeyed: it describes a run, not a stage."""

from __future__ import annotations

from pydantic import Field

from grpo_pipeline.configs.base import Section


class RehearsalConfig(Section):
    recipe: str = Field(description="The recipe rehearsed (its own name).")
    changed: list[str] = Field(default=[], description="What the rehearsal changed, one line each.")
    not_rehearsed: list[str] = Field(
        default=[], description="What it could not rehearse on this machine, and what ran instead."
    )
    demonstrated: list[str] = Field(
        default=[],
        description="Tool episodes run on the stand-in from a scripted first turn calling each built-in tool (a random "
        "stand-in seldom calls by itself), one line each: calls, failures and the tool's result.",
    )

    def lines(self) -> list[str]:
        """The rehearsal as Markdown lines, for the summary and the model card."""
        return [
            f"**Rehearsal of {self.recipe}** on a tiny stand-in model: its scores say the DAG runs, not how the "
            "recipe performs.",
            "",
            "Changed for the rehearsal:",
            "",
            *(f"- {line}" for line in self.changed),
            *(
                ["", "Not rehearsed here:", "", *(f"- {line}" for line in self.not_rehearsed)]
                if self.not_rehearsed
                else []
            ),
            *(
                [
                    "",
                    "Tool calls demonstrated (a scripted first turn):",
                    "",
                    *(f"- {line}" for line in self.demonstrated),
                ]
                if self.demonstrated
                else []
            ),
        ]
