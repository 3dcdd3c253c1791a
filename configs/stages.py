"""stages: alignment in stages, each adding a skill on its own data and rewards, gated so that none is lost.

A recipe without `stages` is one stage: its GRPO rounds on its data. With `stages`, they run in order, each stage
starting from the policy the stages before it kept. A stage inherits the whole recipe and overrides what it needs
(its `data:`, `grpo:` and, for an rft stage, `sft:` fields, its number of rounds); every stage's policy is scored on
every eval suite, and the registry's gate decides whether it is kept: it must beat the champion (the policy it
started from, when the stage before it was kept) on its `target` (`registry.min_delta`, paired bootstrap CI) while
every earlier stage's target stays within `registry.guard_margin` (the gate's non-inferiority guards). A stage the
gate holds back is dropped (the next stage starts from the policy before it) or ends the run (`on_held_back`).
`stage_configs` (`PipelineConfig.stage_configs()`) turns each stage into the whole `PipelineConfig` it runs with, so
everything downstream reads one config type whether or not there are stages; `check_stages` checks them all when the
recipe loads.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator

from grpo_pipeline.configs.base import Section, format_validation_error
from grpo_pipeline.configs.metrics import split_metric

# What a stage may not change: evaluation scores every stage's policy with the recipe's settings (its suites, the
# tools its episodes call), and a stage starts from the last one's policy, so the model and the SFT are the recipe's.
FIXED_GRPO_FIELDS = ("tools", "tool_params", "environment", "max_tool_turns", "work_pool")


class StageSpec(Section):
    """One stage of a staged recipe: the recipe with its own data, rewards and schedule, and the suite it must
    improve."""

    name: str = Field(description="The stage's name: its rounds' outputs, MLflow runs and summary rows carry it.")
    kind: Literal["grpo", "rft"] = Field(
        default="grpo",
        description="'grpo': GRPO rounds on the stage's prompts. 'rft': rejection-sampling fine-tuning, once: the "
        "policy's samples on them (as a GRPO round samples) that the correctness reward verifies, fine-tuned on with "
        "the stage's sft: section (tasks/rft.py).",
    )
    target: str = Field(
        description="What this stage must improve: an eval suite (a name in eval.suites), by the recipe's gating "
        "metric, or a metric of one (`<suite>/<metric>`, e.g. `sub/pass_at_4`). Its gate's metric, and a guarded "
        "metric of every later stage."
    )
    rounds: int | None = Field(
        default=None, ge=1, description="GRPO rounds of this stage at most; null: grpo.rounds. Not for kind 'rft'."
    )
    samples_per_prompt: int = Field(default=4, ge=1, description="kind 'rft': completions sampled per prompt.")
    kept_per_prompt: int = Field(
        default=1, ge=1, description="kind 'rft': distinct verified completions kept per prompt at most."
    )
    data: dict[str, Any] = Field(
        default={}, description="Fields of the data: section this stage changes (its prompts), e.g. {synthetic: ...}."
    )
    replay: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Share of the stage's training prompts drawn from the earlier stages' (seeded, no repeats), so "
        "that it keeps practising what they taught: 0.2 adds one earlier prompt for every four of its own. 0: its own "
        "prompts only. The stage's rewards score both, so the earlier rows need the columns they read.",
    )
    sft: dict[str, Any] = Field(
        default={},
        description="kind 'rft': fields of the sft: section its fine-tuning changes (max_steps, learning_rate, ...).",
    )
    grpo: dict[str, Any] = Field(
        default={},
        description="Fields of the grpo: section this stage changes (rewards, learning_rate, max_steps, ...); not its "
        f"tools ({', '.join(FIXED_GRPO_FIELDS)} stay the recipe's).",
    )
    on_held_back: Literal["drop", "stop"] = Field(
        default="drop",
        description="When the gate holds the stage's policy back (no gain on its target, or an earlier stage's "
        "target lost more than registry.guard_margin): 'drop' goes on to the next stage from the policy before this "
        "one; 'stop' ends the run there.",
    )

    @model_validator(mode="after")
    def _kind_fields(self) -> StageSpec:
        if self.kind == "rft" and self.rounds is not None:
            raise ValueError(f"stage {self.name!r}: an rft stage samples and fine-tunes once; leave out rounds")
        if self.kind == "grpo" and self.sft:
            raise ValueError(f"stage {self.name!r}: a grpo stage runs no SFT; sft: fields are for kind 'rft'")
        return self

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c in "-_" for c in v):
            raise ValueError(f"stage name {v!r} must be letters, digits, '-' or '_' (it names outputs and runs)")
        return v

    @field_validator("grpo")
    @classmethod
    def _tools_stay(cls, v: dict[str, Any]) -> dict[str, Any]:
        if fixed := [k for k in FIXED_GRPO_FIELDS if k in v]:
            raise ValueError(
                f"a stage cannot change grpo.{', grpo.'.join(fixed)}: every stage's policy is evaluated with the "
                "recipe's tools on every suite; set them on the recipe's grpo: section"
            )
        return v

    def overrides(self, raw: dict[str, Any], gating: str, guards: list[str]) -> dict[str, Any]:
        """The recipe's `raw` config (a model_dump) as this stage runs it: its data, sft and grpo fields over the
        recipe's, its rounds, `gating` as the registry's gating metric and `guards` added to its guards, no stages."""
        grpo = merged(raw["grpo"], self.grpo)
        if self.rounds is not None:
            grpo["rounds"] = self.rounds
        registry = {**raw["registry"], "gating_metric": gating, "guard": [*raw["registry"]["guard"], *guards]}
        sections = {"data": merged(raw["data"], self.data), "sft": merged(raw["sft"], self.sft), "grpo": grpo}
        return {**raw, **sections, "registry": registry, "stages": []}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values over it, nested sections merged key by key (a list is replaced whole)."""
    out = dict(base)
    for key, value in over.items():
        nested = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if nested else value
    return out


# The recipe's config: PipelineConfig (configs/schema.py), which imports this module, so the functions below read it
# as the value they are given and validate a stage's config as its class.
Config = TypeVar("Config", bound=Section)


def stage_configs(cfg: Config) -> list[tuple[StageSpec | None, Config]]:
    """Each of `cfg`'s stages with the config its rounds run with (StageSpec.overrides): gated on its target (a suite,
    by the recipe's gating metric, or a metric of one), with every earlier stage's target guarded. [(None, cfg)]
    without stages."""
    if not cfg.stages:
        return [(None, cfg)]
    raw, suites = cfg.model_dump(mode="json"), cfg.eval.suite_names()
    metric = split_metric(cfg.registry.gating_metric, suites)[1].name
    targets = [f"{s.target}/{metric}" if s.target in suites else s.target for s in cfg.stages]
    resolved = []
    for i, stage in enumerate(cfg.stages):
        earlier = list(dict.fromkeys(t for t in targets[:i] if t != targets[i]))
        stage_raw = stage.overrides(raw, targets[i], earlier)
        try:
            resolved.append((stage, type(cfg).model_validate(stage_raw)))
        except ValidationError as err:
            problems = format_validation_error(err, "").splitlines()[1:]  # each `  - field: what to change`
            raise ValueError(f"stages[{i}] ({stage.name}), over the recipe: " + "; ".join(
                p.removeprefix("  - ") for p in problems)) from None  # fmt: skip
    return resolved


def check_stages(cfg: Section) -> None:
    """`cfg`'s stages checked when the recipe loads, as the recipe is: their names differ, an rft stage samples plain
    completions, each target is a suite or a metric of one, and each stage's overrides give a valid config (a
    misspelt field or a batch that does not fit fails here, not after the stages before it)."""
    names, suites = [s.name for s in cfg.stages], cfg.eval.suite_names()
    if len(set(names)) != len(names):
        raise ValueError(f"stages: names must differ, got {names}")
    for i, stage in enumerate(cfg.stages):
        if i == 0 and stage.replay:
            raise ValueError(f"stages[0] ({stage.name}): the first stage has no earlier stage to replay; set replay: 0")
        if stage.kind == "rft" and cfg.grpo.sampling.uses_tools:
            raise ValueError(
                f"stages[{i}] ({stage.name}): an rft stage fine-tunes on plain completions, and this recipe's "
                "samples are tool episodes (grpo.tools, grpo.environment); use kind 'grpo'"
            )
        try:
            stage.target in suites or split_metric(stage.target, suites)
        except ValueError as err:
            raise ValueError(
                f"stages[{i}] ({stage.name}): target {stage.target!r} is neither an eval suite ({suites}) nor a "
                f"metric of one: {err}"
            ) from None
    stage_configs(cfg)
