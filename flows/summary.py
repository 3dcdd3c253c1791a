"""The end-of-run summary: stages (wall time, cached or not), SFT vs GRPO scores, the registered version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from grpo_pipeline.configs.schema import HELDOUT, Metric, PipelineConfig, RehearsalConfig, split_metric
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.decontaminate import Decontamination
from grpo_pipeline.tasks.difficulty import DifficultyResult
from grpo_pipeline.tasks.release.gate import item_metric
from grpo_pipeline.tasks.release.versions import Registration
from grpo_pipeline.tasks.scoring.evaluation import EvalResult
from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci
from grpo_pipeline.tasks.scoring.tool_use import is_tool_metric, tool_use_lines

# The console width the summary's tables are laid out for, unless the caller gives its own: a metric name is never cut
# (a console table squeezes a column narrower than its header to `pass_…`); the score columns wrap into more tables.
WIDTH = 100


@dataclass(frozen=True)
class Round:
    """One GRPO round as the flow ran it: its policy, evaluation, and what it registered and trained on."""

    index: int
    policy: Checkpoint
    result: EvalResult
    registration: Registration | None = None
    difficulty: DifficultyResult | None = None  # the difficulty filter's result, when the round was filtered
    suites: dict[str, EvalResult] = field(default_factory=dict)  # its evaluation on every suite (`result`: gating)
    start: Checkpoint | None = None  # the policy it started from
    train: Ref | None = None  # what it trained on (the training split, or the difficulty filter's rows)

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

    def shown(self) -> str:
        change = "-"
        if self.change is not None and self.change_ci is not None:
            change = f"{self.change:+.3f} [{self.change_ci[0]:+.3f}, {self.change_ci[1]:+.3f}]"
        value = f"{self.value:.3f}" if self.n else "-"
        if self.unscored:  # the denominator, where it is not every item (as in the score tables)
            value += f" (over {self.n} of {self.items})"
        return f"| {self.model} | {value} | {change} |"


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

    def shown(self, column: str) -> str:
        text = f"{self.metrics[column]:.3f}" if column in self.metrics else "-"
        if column == "accuracy" and self.accuracy_ci is not None:
            text += f" [{self.accuracy_ci[0]:.3f}, {self.accuracy_ci[1]:.3f}]"
        if self.unscored.get(column):  # the denominator, where it is not every item
            text += f" (over {self.num_problems - self.unscored[column]} of {self.num_problems})"
        return text


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

    def heading(self, alone: bool) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.eval_settings.items())
        timing = f"; evaluated in {self.seconds:.1f} s" if self.seconds else ""
        if alone and self.name == HELDOUT:
            return f"Held-out scores ({settings}{timing}):"
        return f"Suite `{self.name}` ({settings}{timing}):"


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
    # What ended the rounds before grpo.rounds (a maximum) ran out, or that the last round returned its start.
    stopped: str = ""

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
        scores += [ScoreRow.of(f"grpo round {r.index}", r.result) for r in new]
        models = [(scores[0].model, baseline), *((f"grpo round {r.index}", r.result) for r in new)]
        every = [*(scores_of or {}).items(), *((f"grpo round {r.index}", r.suites) for r in new)]
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
            sft_warning=sft_warning,
            precision="; ".join(dict.fromkeys(r.policy.precision for r in rounds if r.policy.precision)),
            rollouts="; ".join(dict.fromkeys(r.policy.rollouts for r in rounds if r.policy.rollouts)),
            rehearsal=cfg.rehearsal,
            stopped=stopped,
        )

    @property
    def total_seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def headline(self) -> str:
        """One line: the gating metric of each model, what was registered, the wall time."""
        scores = ", ".join(f"{row.model} {row.value:.3f}" for row in self.rounds)
        metric = self.rounds[0].metric if self.rounds else ""
        registered = "; ".join(f"{r.model_name} v{r.version} -> {r.alias}" for r in self.registrations)
        parts = [f"{metric}: {scores}" if scores else "", f"registered {registered}" if registered else ""]
        return "; ".join([p for p in parts if p] + [f"{self.total_seconds:.0f} s"])

    def score_table(self) -> list[dict[str, str | float | int]]:
        """One row per evaluated model and suite with its scores and the eval settings (a Prefect table artifact)."""
        tables = self.suites or [SuiteTable(name=HELDOUT, scores=self.scores, eval_settings=self.eval_settings)]
        return [
            {
                "model": row.model,
                "suite": table.name,
                **row.metrics,
                **row.tools,
                **{f"unscored/{m}": u for m, u in row.unscored.items()},
                **table.eval_settings,
            }
            for table in tables
            for row in table.scores
        ]

    def score_columns(self, rows: Sequence[ScoreRow] | None = None) -> list[str]:
        rows = self.scores if rows is None else rows
        return list(rows[0].metrics) if rows else []

    def to_markdown(self, width: int = WIDTH) -> str:
        """The summary as Markdown whose tables, rendered on a console `width` columns wide (rich pads each cell with
        a space either side), keep every header whole: the score columns are split over as many tables as need be."""
        lines = [
            f"## grpo-pipeline: {self.recipe} (config {self.config_hash})",
            "",
            "| stage | wall time (s) | cached | note |",
            "|---|---:|---|---|",
        ]
        lines += [f"| {s.stage} | {s.seconds:.1f} | {'yes' if s.cached else 'no'} | {s.note} |" for s in self.stages]
        lines.append(f"| **total** | {self.total_seconds:.1f} | | |")
        if self.rehearsal:
            lines += ["", *self.rehearsal.lines()]
        if self.precision:
            lines += ["", f"Training precision: {self.precision}."]
        if self.rollouts:
            lines += ["", f"GRPO rollouts generated by: {self.rollouts}."]
        if self.sft_warning:
            lines += ["", f"**Warning**: {self.sft_warning}."]
        if self.decontamination:
            lines += ["", f"{self.decontamination[:1].upper()}{self.decontamination[1:]}."]
        lines += self.suite_lines(width)
        if len(self.rounds) > 1:
            first = self.rounds[0]
            over = f"{first.items or first.n} items"
            if any(row.unscored for row in self.rounds):
                over = f"{over}, those both models scored"
            lines += [
                "",
                f"Rounds ({first.metric}; change against the model before it, paired bootstrap 95% CI over the same "
                f"{over}):",
                "",
                f"| model | {first.metric} | change [95% CI] |",
                "|---|---:|---|",
                *(row.shown() for row in self.rounds),
            ]
        if self.stopped:
            lines += ["", f"Rounds: {self.stopped}."]
        if self.difficulty_filters:
            lines += ["", *(f"Difficulty filter before {f.label}: {f.describe()}." for f in self.difficulty_filters)]
        if self.health:
            lines += ["", *self.health_lines()]
        if any(self.notes):
            lines += ["", "Round notes:", ""]
            lines += [f"- round {i}: {note}" for i, notes in enumerate(self.notes, 1) for note in notes]
        if self.registrations:
            lines += ["", *self.registration_lines()]
        return "\n".join(lines)

    def suite_lines(self, width: int = WIDTH) -> list[str]:
        """Each suite's scores as tables that fit `width` (and its tool use, where it ran tool episodes), then what the
        correctness reward left unscored."""
        tables = self.suites or [SuiteTable(name=HELDOUT, scores=self.scores, eval_settings=self.eval_settings)]
        lines = []
        for table in tables:
            lines += ["", table.heading(alone=len(tables) == 1)]
            for group in self.score_groups(width, table.scores):
                lines += ["", "| model | " + " | ".join(group) + " |", "|---|" + "---:|" * len(group)]
                lines += [f"| {row.model} | " + " | ".join(row.shown(c) for c in group) + " |" for row in table.scores]
            lines += tool_use_lines([(row.model, row.tools) for row in table.scores])
        named = len(tables) > 1
        unscored = [
            f"- {row.model}{f' on {table.name}' if named else ''}: {row.unscored_line}"
            for table in tables
            for row in table.scores
            if row.unscored_line
        ]
        if unscored:
            lines += ["", "Unscored completions (left out of the scores above, which say over how many items):"]
            lines += unscored
        return lines

    def score_groups(self, width: int = WIDTH, rows: Sequence[ScoreRow] | None = None) -> list[list[str]]:
        """The score columns in tables that fit `width`, each beside the model column: a metric's family (`pass_at_*`,
        `maj_at_*`, `reward/*`) stays in one table where it fits in one."""
        rows = self.scores if rows is None else rows
        cols = self.score_columns(rows)
        cells = {c: [c, *(row.shown(c) for row in rows)] for c in cols}
        wide = {c: _cell_width(texts) for c, texts in cells.items()}
        model = _cell_width(["model", *(row.model for row in rows)])
        groups: list[list[str]] = [[]]
        for family in _families(cols):
            if groups[-1] and model + sum(wide[c] for c in groups[-1] + family) > width:
                groups.append([])  # the family starts a table of its own
            for col in family:  # one wider than a whole table is split over several
                if groups[-1] and model + sum(wide[c] for c in [*groups[-1], col]) > width:
                    groups.append([])
                groups[-1].append(col)
        return [g for g in groups if g]

    def registration_lines(self) -> list[str]:
        """The registered versions, what the gate decided on which metric, and why where it could not compare."""
        metrics = {r.gate.metric for r in self.registrations}
        value = metrics.pop() if len(metrics) == 1 else "gating metric"
        names = {r.model_name for r in self.registrations}
        one_name = names.pop() if len(names) == 1 else None  # then said once, above a table that fits 80 columns
        lines = [f"Registered versions of {one_name}:", ""] if one_name else []
        lines += [
            f"| version | alias | gate | {value} | champion | difference [95% CI] | n |",
            "|---|---|---|---:|---|---|---:|",
            *(_registration_row(r, metric=value == "gating metric", name=not one_name) for r in self.registrations),
        ]
        guarded = [r for r in self.registrations if r.gate.guards]
        if guarded:
            lines += ["", "Guarded metrics (registry.guard; each must stay within guard_margin of the champion):"]
            lines += [f"- {r.model_name} v{r.version}: {line}" for r in guarded for line in r.gate.guard_lines()]
        unscored = [r for r in self.registrations if r.gate.decision == "unscored"]
        if unscored:
            lines += ["", "Not compared by the gate (decision `unscored`):"]
            lines += [f"- {r.model_name} v{r.version}: {r.gate.reason}" for r in unscored]
        return lines

    def health_lines(self) -> list[str]:
        """The "Training health" part: each round's alarms, or one line saying that every round was healthy."""
        if not any(self.health):
            return [f"Training health: all {len(self.health)} GRPO round(s) healthy, no alarm (monitors.*)."]
        header = "Training health (monitors.*; a round with alarms takes champion only with registry.allow_unhealthy):"
        lines = [header, ""]
        for i, alarms in enumerate(self.health, 1):
            lines.append(f"- round {i}: {f'{len(alarms)} alarm(s)' if alarms else 'healthy'}")
            lines += [f"  - {alarm}" for alarm in alarms]
        return lines


def _registration_row(r: Registration, metric: bool = False, name: bool = True) -> str:
    g = r.gate
    version = f"{r.model_name} v{r.version}" if name else f"v{r.version}"
    champion = "-" if g.champion_version is None else f"v{g.champion_version} ({g.champion:.3f})"
    diff = "-" if g.delta is None else f"{g.delta:+.3f} [{g.ci_low:+.3f}, {g.ci_high:+.3f}]"
    value = f"{g.metric} {g.challenger:.3f}" if metric else f"{g.challenger:.3f}"
    return f"| {version} | {r.alias} | {g.decision} | {value} | {champion} | {diff} | {g.n} |"


def _cell_width(texts: Sequence[str]) -> int:
    """A column's width on the console: its longest text and a space of padding either side."""
    return max(len(t) for t in texts) + 2


def _families(cols: list[str]) -> list[list[str]]:
    """`cols` in runs of one family: `accuracy`, `pass_at_1 pass_at_4`, `maj_at_1 ...`, `reward/a reward/b`."""
    runs: list[tuple[str, list[str]]] = []
    for col in cols:
        metric = Metric.read(col)
        family = metric.kind if metric else col.split("/")[0]  # tools/*: a family of their own
        if runs and runs[-1][0] == family:
            runs[-1][1].append(col)
        else:
            runs.append((family, [col]))
    return [members for _, members in runs]
