"""The training loop and its release: the recipe's GRPO rounds, or its stages one after another (configs/stages.py:
GRPO rounds, or one rejection-sampling fine-tuning), each round evaluated on every suite and registered as the
registry's gate says (`Release`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from grpo_pipeline.configs.schema import HELDOUT, ModelConfig, PipelineConfig, StageSpec
from grpo_pipeline.flows.inputs import sft_bar, stage_inputs
from grpo_pipeline.flows.stages import (
    Stages,
    check_inputs,
    difficulty_filter,
    evaluate,
    grpo_train,
    grpo_train_remote,
    register,
    rejection_sample,
    replay_mixture,
    sft_warmup,
)
from grpo_pipeline.flows.summary import Round, stage_matrix
from grpo_pipeline.tasks.core.common import Checkpoint, DatasetRefs, Ref
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.decontaminate import Decontamination
from grpo_pipeline.tasks.difficulty import DifficultyResult, check_enough, filters_round
from grpo_pipeline.tasks.grpo import GRPORound, round_label
from grpo_pipeline.tasks.release.champion import CHAMPION
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.scoring.rollouts import Rollouts

Scores = dict[str, EvalResult]  # a policy's evaluation on every suite, by suite name, in the configured order


def staged_rounds(release: Release, policy: Checkpoint, scores: Scores, data: DatasetRefs) -> tuple[list[Round], str]:
    """The recipe's GRPO rounds, stage by stage (configs/stages.py), and what ended them early. Each stage's rounds
    start from the policy the stages before it kept, on the stage's own prompts, and the registry's gate (the stage's
    target suite, every earlier stage's guarded) decides whether the stage is kept: a stage none of whose rounds
    took `champion` is dropped, or ends the run (its on_held_back). Without stages: the recipe's rounds."""
    run = release.run
    rounds: list[Round] = []
    verdicts = []
    earlier: list[Ref] = []  # the training prompts of the stages so far, which a later stage may replay
    for spec, stage_cfg in release.cfg.stage_configs():
        if spec is None:
            return grpo_rounds(release, policy, scores, data)
        stage_data = data if not spec.data else stage_inputs(run, stage_cfg, spec.name, release.suites)
        own, replayed = stage_data.train, spec.replay > 0  # never the first stage's (check_stages)
        if replayed:  # its own prompts and a share of the earlier stages' (StageSpec.replay)
            mixture = run(
                f"replay-{spec.name}", replay_mixture,
                train=own, earlier=earlier, share=spec.replay, seed=stage_cfg.data.seed, run_dir=stage_cfg.run_dir,
                label=spec.name,
            )  # fmt: skip
            stage_data = stage_data.model_copy(update={"train": mixture})
        earlier.append(own)
        if spec.data or spec.grpo or replayed:  # its rewards score its rows, its prompts fit, a batch of them exists
            run(
                f"check_inputs-{spec.name}", check_inputs, listed=False,
                data=stage_data, base=release.base, grpo=stage_cfg.grpo, eval_cfg=stage_cfg.eval, sft_enabled=False,
            )  # fmt: skip
        stage_release = dataclasses.replace(release, cfg=stage_cfg)
        if spec.kind == "rft":
            ran, stopped = rft_stage(stage_release, spec, policy, stage_data, before=rounds)
        else:
            ran, stopped = grpo_rounds(stage_release, policy, scores, stage_data, stage=spec.name, before=rounds)
        rounds += ran
        kept = [x for x in ran if x.registration and x.registration.alias == CHAMPION]
        if kept:
            policy, scores = kept[-1].policy, kept[-1].suites
            verdicts.append(f"stage {spec.name} kept ({kept[-1].name}: {kept[-1].registration.gate.reason})")
            continue
        last = next((x.registration for x in reversed(ran) if x.registration), None)
        why = last.gate.reason if last else stopped or "no round trained a new policy"
        verdicts.append(f"stage {spec.name} held back ({why})")
        if spec.on_held_back == "stop":
            verdicts.append("the run stopped there (on_held_back: stop)")
            break
    return rounds, "; ".join(verdicts)


def rft_stage(
    release: Release, spec: StageSpec, policy: Checkpoint, data: DatasetRefs, before: list[Round]
) -> tuple[list[Round], str]:
    """A `kind: rft` stage: rejection_sample (the policy's verified samples on the stage's prompts) -> sft_warmup on
    them from the policy -> evaluate -> register, as one round of the stage; or why it did not train (too few rows
    for an SFT batch)."""
    run, cfg = release.run, release.cfg
    ctx = RunContext.of(cfg)
    sampled = run(
        f"rejection_sample-{spec.name}", rejection_sample,
        policy=policy, train=data.train, rollouts=Rollouts.of(cfg), ctx=ctx, label=spec.name,
        samples_per_prompt=spec.samples_per_prompt, kept_per_prompt=spec.kept_per_prompt,
    )  # fmt: skip
    if sampled.kept < cfg.sft.batch_size:
        return [], (f"rejection sampling kept {sampled.kept} rows, fewer than an SFT batch (sft.batch_size "
                    f"{cfg.sft.batch_size}): {sampled.describe()}")  # fmt: skip
    tuned = run(
        f"sft-{spec.name}", sft_warmup,
        base=policy, train=sampled.train, cfg=cfg.sft, model_cfg=release.model_cfg, ctx=ctx, **sft_bar(cfg, data),
    )  # fmt: skip
    scores = evaluate_suites(run, cfg, tuned, release.suites, round_label(1, spec.name))
    step = Round(index=1, policy=tuned, result=scores[cfg.gating_suite()], suites=scores, start=policy,
                 train=sampled.train, stage=spec.name, kind="rft", rft=sampled)  # fmt: skip
    return [release.register(step, before)], ""


def grpo_rounds(
    release: Release,
    policy: Checkpoint,
    scores: Scores,
    data: DatasetRefs,
    stage: str = "",
    before: list[Round] | None = None,
) -> tuple[list[Round], str]:
    """The GRPO rounds from `policy` (scored `scores`), of `stage` after the rounds `before` it, each registered as
    the registry says, and why they ended early (empty when grpo.rounds ran out). grpo.rounds is a maximum: no round
    starts after one that returned its start or saturated its probe, nor when the difficulty filter leaves fewer
    prompts than a step takes (unless grpo.difficulty_filter.on_too_few fails the run then)."""
    cfg = release.cfg
    rounds: list[Round] = []
    earlier = before or []
    stopped = ""
    for r in range(1, cfg.grpo.rounds + 1):
        start, start_scores = (rounds[-1].policy, rounds[-1].suites) if rounds else (policy, scores)
        kept = round_prompts(release.run, cfg, r, start, data, stage)
        if kept is not None and (why := check_enough(kept, cfg.grpo.difficulty_filter)):
            stopped = f"{why} ({r - 1} of at most {cfg.grpo.rounds} rounds ran)"
            break
        step = grpo_round(release, r, start=start, start_scores=start_scores, data=data, kept=kept, stage=stage)
        rounds.append(step)
        if not step.returned_start and (cfg.registry.register_each_round or r == cfg.grpo.rounds):
            rounds[-1] = release.register(step, [*earlier, *rounds[:-1]])
        if stopped := stop_reason(step, cfg.grpo.rounds):
            break
    new = [i for i, x in enumerate(rounds) if not x.returned_start]
    if new and rounds[new[-1]].registration is None:  # rounds ended early: the last new policy is the run's result
        rounds[new[-1]] = release.register(rounds[new[-1]], [*earlier, *rounds[: new[-1]]])
    return rounds, stopped


def round_prompts(
    run: Stages, cfg: PipelineConfig, r: int, start: Checkpoint, data: DatasetRefs, stage: str = ""
) -> DifficultyResult | None:
    """The difficulty filter before round `r`, where it filters that round: the prompts `start` sometimes, not
    always, solves."""
    if not filters_round(cfg.grpo.difficulty_filter, r):
        return None
    return run(
        f"difficulty_filter-{round_label(r, stage)}", difficulty_filter,
        policy=start, train=data.train, cfg=cfg.grpo.difficulty_filter, rollouts=Rollouts.of(cfg),
        ctx=RunContext.of(cfg), label=round_label(r, stage), min_kept=cfg.grpo.prompts_per_step,
    )  # fmt: skip


def grpo_round(
    release: Release,
    r: int,
    *,
    start: Checkpoint,
    start_scores: Scores,
    data: DatasetRefs,
    kept: DifficultyResult | None = None,
    stage: str = "",
) -> Round:
    """One GRPO round from `start`: grpo_train on the training split (or on the difficulty filter's `kept` prompts)
    -> evaluate. A round that returned its start unchanged is not evaluated again: its scores are its start's
    (`start_scores`)."""
    run, cfg = release.run, release.cfg
    ctx, train = RunContext.of(cfg), data.train if kept is None else kept.train
    # Each round starts from the previous policy; TRL builds the reference model from it (reset per round).
    spec = GRPORound(
        start=start, train=train, cfg=cfg.grpo, model_cfg=release.model_cfg, round_index=r, stage=stage, ctx=ctx,
        held_out=data.probe, correctness_reward=cfg.eval.correctness_reward, monitors=cfg.monitors,
        code_dir=cfg.code_dir,
    )  # fmt: skip
    policy = run(spec.name, grpo_train if cfg.grpo.work_pool is None else grpo_train_remote, spec=spec)
    label = round_label(r, stage)
    scores = start_scores if policy.kept_start else evaluate_suites(run, cfg, policy, release.suites, label)
    return Round(index=r, policy=policy, result=scores[cfg.gating_suite()], difficulty=kept, suites=scores, start=start,
                 train=train, stage=stage)  # fmt: skip


def stop_reason(step: Round, max_rounds: int) -> str:
    """What ended the rounds at `step`, if anything did (empty when the next round starts or grpo.rounds ran out)."""
    r, ran = step.index, f"{step.index} of at most {max_rounds} rounds ran"
    if step.returned_start:
        return f"round {r} returned its start unchanged (no step beat it on the probe), so nothing was registered " + (
            "for it" if r == max_rounds else f"for it and no further round started ({ran})"
        )
    if r < max_rounds and step.policy.probe_accuracy is not None and step.policy.probe_accuracy >= 1.0:
        return f"round {r}'s probe is saturated (greedy accuracy 1.0): no further round started ({ran})"
    return ""


def evaluate_suites(run: Stages, cfg: PipelineConfig, policy: Checkpoint, suites: dict[str, Ref], label: str) -> Scores:
    """`policy` scored on every suite, each suite its own cached stage (`evaluate-<label>` for the held-out split,
    as before suites existed, `evaluate-<label>-<suite>` for the others). The training rewards' means are scored on
    the held-out split only: another benchmark's rows need not have the columns they read."""
    calls = []
    for name, rows in suites.items():
        held_out = cfg.eval.suite(name).source == HELDOUT
        stage_label = label if name == HELDOUT else f"{label}-{name}"
        calls.append((f"evaluate-{stage_label}", evaluate, dict(
            policy=policy, held_out=rows, cfg=cfg.eval.for_suite(name), ctx=RunContext.of(cfg), label=stage_label,
            rewards=cfg.grpo.rewards if held_out else None,
        )))  # fmt: skip
    # On a Ray cluster every suite is a task of its own, all sent at once; here they take turns for this machine.
    results = run.at_once(calls) if cfg.distributed.backend == "ray" else [run(n, s, **i) for n, s, i in calls]
    for name, record in zip(suites, run.records[-len(calls) :], strict=True):
        run.suite_seconds[name] = run.suite_seconds.get(name, 0.0) + record.seconds
    return {name: r.model_copy(update={"suite": name}) for name, r in zip(suites, results, strict=True)}


@dataclass(frozen=True)
class Release:
    """What every round of the run is trained, scored and registered with, and how it is registered: each version's
    parent is the version registered for the round before it, else the base model by name; the gate compares it
    with the model it is to replace (tasks/register.py). A staged recipe's stage gets a copy with its own `cfg`."""

    run: Stages
    recipe: PipelineConfig  # the whole recipe, with its stages: their matrix goes on each stage's card
    cfg: PipelineConfig  # the recipe's, or a stage's own (configs/stages.py)
    suites: dict[str, Ref]  # every eval suite's rows, by name
    model_cfg: ModelConfig  # the model section, a registered base pinned to its version (pin_model)
    base: Checkpoint
    baselines: Scores
    sft_warning: str | None = None
    clean: Decontamination | None = None

    def register(self, step: Round, before: list[Round]) -> Round:
        """`step` with the version registered for it; `before`: the rounds that ran before it."""
        cfg, r, policy = self.cfg, step.index, step.policy
        parent = next((x.registration.model_uri for x in reversed(before) if x.registration), self.base.lineage)
        tags = {
            "config_hash": cfg.fingerprint(),
            "recipe": cfg.name,
            "data_fingerprint": step.train.fingerprint if step.train else "",  # what it trained on (filtered or not)
            "parent_model": parent,
            "parent_run_id": step.start.run_id or "" if step.start else "",
            "round": str(r),
            **({"stage": step.stage} if step.stage else {}),  # a staged recipe's stage (configs/stages.py)
            # the objective trained: GRPO's, or an rft stage's SFT on its verified samples
            **({f"grpo.{name}": str(v) for name, v in cfg.grpo.algorithm().items()} if step.kind == "grpo" else {}),
            **({"rft.keep_rate": f"{step.rft.keep_rate:.4f}", "rft.kept": str(step.rft.kept)} if step.rft else {}),
            **({"sft_warning": self.sft_warning} if self.sft_warning else {}),  # the model card says so too
            **({"rehearsal_of": cfg.rehearsal.recipe} if cfg.rehearsal else {}),  # grpo-pipeline rehearse
            **({**self.clean.tags(), "decontam.line": self.clean.line()} if self.clean else {}),  # dropped rows
        }
        gating, recipe = cfg.gating_suite(), self.recipe
        start = {"sft" if recipe.sft.enabled else "base": self.baselines}  # the policy the stages started from
        registration = self.run(
            f"register-{step.label}", register,
            policy=policy, result=step.suites[gating], baseline=self.baselines[gating], cfg=cfg.registry,
            ctx=RunContext.of(cfg), config_yaml=cfg.to_yaml(), tags=tags, suites=step.suites, baselines=self.baselines,
            matrix=stage_matrix(recipe, [*before, step], start) or None,
        )  # fmt: skip
        return dataclasses.replace(step, registration=registration)
