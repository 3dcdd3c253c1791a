"""The end-of-run summary: stages (wall time, cached or not), SFT vs GRPO scores, the registered version."""

from __future__ import annotations

from pydantic import BaseModel

from grpo_pipeline.configs.schema import PipelineConfig
from grpo_pipeline.tasks.evaluate import EvalResult
from grpo_pipeline.tasks.register import Registration


class StageRecord(BaseModel):
    stage: str
    seconds: float
    cached: bool
    state: str


class ScoreRow(BaseModel):
    model: str
    metrics: dict[str, float]


class Summary(BaseModel):
    recipe: str
    config_hash: str
    stages: list[StageRecord]
    scores: list[ScoreRow]
    registrations: list[Registration]
    eval_settings: dict[str, float | int]

    @classmethod
    def build(
        cls,
        cfg: PipelineConfig,
        stages: list[StageRecord],
        baseline: EvalResult,
        rounds: list[tuple[EvalResult, Registration | None]],
    ) -> Summary:
        scores = [ScoreRow(model="sft" if cfg.sft.enabled else "base", metrics=baseline.metrics())]
        scores += [ScoreRow(model=f"grpo round {i}", metrics=r.metrics()) for i, (r, _) in enumerate(rounds, 1)]
        return cls(
            recipe=cfg.name,
            config_hash=cfg.fingerprint()[:12],
            stages=stages,
            scores=scores,
            registrations=[reg for _, reg in rounds if reg is not None],
            eval_settings={
                "problems": baseline.num_problems,
                "n": baseline.n_samples,
                "temperature": baseline.temperature,
                "top_p": baseline.top_p,
                "max_new_tokens": baseline.max_new_tokens,
            },
        )

    @property
    def total_seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def score_table(self) -> list[dict[str, str | float | int]]:
        """One row per evaluated model with its scores and the eval settings (a Prefect table artifact)."""
        return [{"model": row.model, **row.metrics, **self.eval_settings} for row in self.scores]

    def score_columns(self) -> list[str]:
        return list(self.scores[0].metrics) if self.scores else []

    def to_markdown(self) -> str:
        lines = [
            f"## grpo-pipeline: {self.recipe} (config {self.config_hash})",
            "",
            "| stage | wall time (s) | cached |",
            "|---|---:|---|",
        ]
        lines += [f"| {s.stage} | {s.seconds:.1f} | {'yes' if s.cached else 'no'} |" for s in self.stages]
        lines.append(f"| **total** | {self.total_seconds:.1f} | |")
        cols = self.score_columns()
        settings = ", ".join(f"{k}={v}" for k, v in self.eval_settings.items())
        lines += [
            "",
            f"Held-out scores ({settings}):",
            "",
            "| model | " + " | ".join(cols) + " |",
            "|---|" + "---:|" * len(cols),
        ]
        lines += [f"| {row.model} | " + " | ".join(f"{row.metrics[c]:.3f}" for c in cols) + " |" for row in self.scores]
        if self.registrations:
            lines += [
                "",
                "| registered model | version | alias | gating metric | value | previous champion |",
                "|---|---|---|---|---:|---|",
            ]
            lines += [
                f"| {r.model_name} | {r.version} | {r.alias} | {r.gating_metric} | {r.gating_value:.3f} | "
                f"{_previous_champion(r)} |"
                for r in self.registrations
            ]
        return "\n".join(lines)


def _previous_champion(r: Registration) -> str:
    return "-" if r.previous_champion is None else f"v{r.previous_champion} ({r.previous_champion_value:.3f})"
