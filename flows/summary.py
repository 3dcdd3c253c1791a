"""What a run's summary holds: each stage run (wall time, cached or not), SFT vs GRPO scores on every eval suite, the
registered versions, each round's alarms and notes. How it is shown (Markdown tables, the log's headline, the Prefect
table) is flows/summary_tables.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from grpo_pipeline.configs.schema import HELDOUT, PipelineConfig, RehearsalConfig, split_metric
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.decontaminate import Decontamination
from grpo_pipeline.tasks.difficulty import DifficultyResult
from grpo_pipeline.tasks.grpo import round_label
from grpo_pipeline.tasks.release.champion import CHAMPION
from grpo_pipeline.tasks.release.gate import item_metric
from grpo_pipeline.tasks.release.versions import Registration
from grpo_pipeline.tasks.rft import RFTData
from grpo_pipeline.tasks.scoring.matrix import StageRow
from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.scoring.tool_use import is_tool_metric


@dataclass(frozen=True)
class Round:
    """One GRPO round as the flow ran it: its policy, evaluation, and what it registered and trained on."""

    index: int  # within its stage
    policy: Checkpoint
    result: EvalResult
    registration: Registration | None = None
    difficulty: DifficultyResult | None = None  # the difficulty filter's result, when the round was filtered
    suites: dict[str, EvalResult] = field(default_factory=dict)  # its evaluation on every suite (`result`: gating)
    start: Checkpoint | None = None  # the policy it started from
    train: Ref | None = None  # what it trained on (the training split, or the difficulty filter's rows)
    stage: str = ""  # the stage of a staged recipe it belongs to (configs/stages.py)
    kind: str = "grpo"  # what trained it: GRPO, or an rft stage's fine-tuning on its verified samples
    rft: RFTData | None = None  # an rft stage's rejection sampling

    @property
    def name(self) -> str:
        """How the summary names the round's model: `grpo round 2`, or `grpo <stage> round 2` in a staged recipe."""
        if self.kind == "rft":
            return f"rft {self.stage}"
        return f"grpo {self.stage} round {self.index}" if self.stage else f"grpo round {self.index}"

    @property
    def label(self) -> str:
        """The round's label in stage and MLflow run names: `r2`, or `<stage>-r2` in a staged recipe."""
        return round_label(self.index, self.stage)

    @property
    def returned_start(self) -> bool:
        """The round returned its start unchanged (grpo.keep_over_start): not evaluated again, never registered."""
        return self.policy.kept_start


class StageRecord(BaseModel):
    stage: str
    seconds: float
    cached: bool
    state: str
    note: str = ""  # e.g. "resumed from step 200" when a training stage continued an interrupted attempt


class RoundRow(BaseModel):
    """One row of the rounds table: a model's gating metric over the items it scored and its change against the model
    before it, with the paired bootstrap 95% CI over the eval items both scored (tasks/scoring/metrics.py)."""

    model: str
    metric: str
    value: float  # over the scored items (NaN when none was)
    change: float | None = None
    change_ci: tuple[float, float] | None = None
    n: int  # the items this model scored
    items: int = 0  # the eval items, scored or not (0: as many as `n`)

    @classmethod
    def series(
        cls, metric: str, models: list[tuple[str, EvalResult]], seed: int, suites: Sequence[str] = (HELDOUT,)
    ) -> list[RoundRow]:
        rows: list[RoundRow] = []
        before = None
        bare = split_metric(metric, list(suites))[1]  # `gsm8k_test/accuracy`: the gating suite's accuracy
        for model, result in models:
            every = item_metric(result.items(), bare)
            now = every.dropna()  # an unscored item (NaN) counts in neither the mean, nor n, nor a change
            value = float(now.mean()) if len(now) else float("nan")
            row = cls(model=model, metric=metric, value=value, n=len(now), items=len(every))
            if before is not None and every.index.isin(before.index).all():  # the same eval set
                paired = before.reindex(now.index).dropna()  # the items both models scored
                if len(paired):
                    change, low, high = paired_bootstrap_ci(paired.tolist(), now[paired.index].tolist(), seed=seed)
                    row.change, row.change_ci = change, (low, high)
            rows.append(row)
            before = every
        return rows

    @property
    def unscored(self) -> bool:
        return self.n < self.items


class ScoreRow(BaseModel):
    model: str
    metrics: dict[str, float]
    accuracy_ci: tuple[float, float] | None = None
    # Per metric, the items it could not score (left out of its mean), out of `num_problems`; and the line saying
    # how many completions the correctness reward left unscored and why ("" when it scored them all).
    unscored: dict[str, int] = {}
    num_problems: int = 0
    unscored_line: str = ""
    # A tool-using policy's episodes (EvalResult.tools): shown in a table of their own, not among the scores.
    tools: dict[str, float] = {}

    @classmethod
    def of(cls, model: str, result: EvalResult) -> ScoreRow:
        return cls(
            model=model,
            metrics={name: v for name, v in result.metrics().items() if not is_tool_metric(name)},
            tools=result.tools,
            accuracy_ci=result.accuracy_ci,
            unscored=result.unscored,
            num_problems=result.num_problems,
            unscored_line=result.unscored_line(),
        )


def stage_matrix(
    cfg: PipelineConfig, rounds: Sequence[Round], scores_of: dict[str, dict[str, EvalResult]]
) -> list[StageRow]:
    """A staged run's matrix (tasks/scoring/matrix.py): the start's row, then one per stage that trained a new policy,
    kept when one of its rounds took champion (undecided, None, while its last round is not registered yet); empty
    without stages."""
    if not cfg.stages or not scores_of:
        return []
    suites = cfg.eval.suite_names()
    metric = split_metric(cfg.registry.gating_metric, suites)[1].name
    label, start = list(scores_of.items())[-1]  # the policy the stages started from (SFT's, or the base)
    rows = [StageRow.of("", label, start, metric, suites)]
    for stage in cfg.stages:
        new = [r for r in rounds if r.stage == stage.name and not r.returned_start]
        if new:
            last = new[-1]
            took = any(r.registration is not None and r.registration.alias == CHAMPION for r in new)
            kept = None if last.registration is None and not took else took
            rows.append(StageRow.of(stage.name, last.name, last.suites, metric, suites, kept=kept))
    return rows


class SuiteTable(BaseModel):
    """One eval suite's scores: a row per evaluated model, the settings they were computed with, the wall time of
    the suite's evaluations in this run (cached ones count their lookup only)."""

    name: str
    scores: list[ScoreRow]
    eval_settings: dict[str, float | int]
    seconds: float = 0.0

    @classmethod
    def of(cls, name: str, models: list[tuple[str, EvalResult]], seconds: float = 0.0) -> SuiteTable:
        return cls(
            name=name,
            scores=[ScoreRow.of(model, result) for model, result in models],
            eval_settings=_settings(models[0][1]),
            seconds=seconds,
        )


def _settings(result: EvalResult) -> dict[str, float | int]:
    return {
        "problems": result.num_problems,
        "n": result.n_samples,
        "temperature": result.temperature,
        "top_p": result.top_p,
        "max_new_tokens": result.max_new_tokens,
        "seed": result.seed,
    }


class Summary(BaseModel):
    recipe: str
    config_hash: str
    stages: list[StageRecord]
    scores: list[ScoreRow]
    registrations: list[Registration]
    eval_settings: dict[str, float | int]
    rounds: list[RoundRow] = []
    difficulty_filters: list[DifficultyResult] = []
    # Each GRPO round's training-health alarms (tasks/training/health.py), in round order; empty for healthy rounds.
    health: list[list[str]] = []
    # Each GRPO round's notes that are no alarm (saturation, the step it kept), in round order.
    notes: list[list[str]] = []
    round_names: list[str] = []  # a staged recipe's rounds' names, in the order they ran (each names its stage)
    # Said before GRPO when the SFT policy is far below its own training data (tasks/sft_check.py).
    sft_warning: str | None = None
    # How the GRPO rounds trained: weights', optimizer state's and autocast's dtypes (model.train_precision).
    precision: str = ""
    rollouts: str = ""  # what generated GRPO's rollouts, each distinct answer once
    # `grpo-pipeline rehearse`: which recipe this run rehearses, what it changed, what it could not rehearse.
    rehearsal: RehearsalConfig | None = None
    # Every eval suite's table, in the configured order (`scores` and `eval_settings` are the gating suite's).
    suites: list[SuiteTable] = []
    decontamination: str = ""  # what decontamination dropped from the training rows, in a sentence
    # What ended the rounds before grpo.rounds (a maximum) ran out, or that the last round returned its start; in a
    # staged recipe, which stages were kept and why.
    stopped: str = ""
    matrix: list[StageRow] = []  # a staged recipe's stage x suite matrix: what each stage added and what it cost
    rejection_sampling: list[RFTData] = []  # each rft stage's: its keep rate and the rows it fine-tuned on

    @classmethod
    def build(
        cls,
        cfg: PipelineConfig,
        stages: list[StageRecord],
        baseline: EvalResult,
        rounds: list[Round],
        sft_warning: str | None = None,
        scores_of: dict[str, dict[str, EvalResult]] | None = None,
        suite_seconds: dict[str, float] | None = None,
        clean: Decontamination | None = None,
        stopped: str = "",
    ) -> Summary:
        new = [r for r in rounds if not r.returned_start]  # a round that returned its start has no scores of its own
        scores = [ScoreRow.of("sft" if cfg.sft.enabled else "base", baseline)]
        gating = cfg.gating_suite()  # a staged recipe's rounds are each gated on their stage's suite: compare on one
        scores += [ScoreRow.of(r.name, r.suites.get(gating, r.result)) for r in new]
        models = [(scores[0].model, baseline), *((r.name, r.suites.get(gating, r.result)) for r in new)]
        every = [*(scores_of or {}).items(), *((r.name, r.suites) for r in new)]
        suites = [
            SuiteTable.of(name, [(model, by_suite[name]) for model, by_suite in every if name in by_suite],
                          (suite_seconds or {}).get(name, 0.0))
            for name in cfg.eval.suite_names()
            if scores_of
        ]  # fmt: skip
        return cls(
            suites=suites,
            decontamination=clean.line() if clean else "",
            recipe=cfg.name,
            config_hash=cfg.fingerprint()[:12],
            stages=stages,
            scores=scores,
            rounds=RoundRow.series(cfg.registry.gating_metric, models, cfg.seed, cfg.eval.suite_names()),
            registrations=[r.registration for r in rounds if r.registration is not None],
            eval_settings=_settings(baseline),
            difficulty_filters=[r.difficulty for r in rounds if r.difficulty is not None],
            health=[list(r.policy.alarms) for r in rounds],
            notes=[list(r.policy.notes) for r in rounds],
            round_names=[r.name for r in rounds] if cfg.stages else [],
            sft_warning=sft_warning,
            precision="; ".join(dict.fromkeys(r.policy.precision for r in rounds if r.policy.precision)),
            rollouts="; ".join(dict.fromkeys(r.policy.rollouts for r in rounds if r.policy.rollouts)),
            rehearsal=cfg.rehearsal,
            stopped=stopped,
            matrix=stage_matrix(cfg, rounds, scores_of or {}),
            rejection_sampling=[r.rft for r in rounds if r.rft is not None],
        )

    @property
    def total_seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    @property
    def suite_tables(self) -> list[SuiteTable]:
        """Every eval suite's table; a summary built without them has the gating suite's (`scores`) alone."""
        return self.suites or [SuiteTable(name=HELDOUT, scores=self.scores, eval_settings=self.eval_settings)]
