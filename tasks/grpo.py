"""Stage 4, grpo_train: Group Relative Policy Optimization with TRL's GRPOTrainer.

GRPO (Shao et al. 2024, "DeepSeekMath", sec. 4.1) samples a group of G completions per prompt, scores them with
the reward functions, and uses each completion's reward relative to its group (r - mean) / std as the advantage,
so no value model is needed. Iterative GRPO (sec. 4.2) is a sequence of rounds: each round starts from the last
round's policy and, because TRL builds the reference model from the starting checkpoint's *path*, the reference
is reset to that policy too (only matters when beta > 0).

Chat prompts (data.prompt_format: chat) reach GRPOTrainer as messages: it renders them with the tokenizer's chat
template and hands the rewards each completion as an assistant message (tasks/core/chat.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from grpo_pipeline.configs.algorithm import PolicyLossConfig, vllm_corrections_set
from grpo_pipeline.configs.schema import (
    CORRECTNESS,
    UNKEYED,
    ConfigError,
    GRPOStageConfig,
    ModelConfig,
    MonitorsConfig,
    RewardSpec,
)
from grpo_pipeline.rewards import build_rewards
from grpo_pipeline.tasks.core.chat import conversational_dataset
from grpo_pipeline.tasks.core.common import Checkpoint, Ref, logger
from grpo_pipeline.tasks.core.launch import launched
from grpo_pipeline.tasks.core.stage import RunContext, stage, user_code
from grpo_pipeline.tasks.training.health import RoundHealth, health_callback
from grpo_pipeline.tasks.training.trainer import adapter_args, load_split, train_policy
from grpo_pipeline.tasks.training.vllm_rollouts import prepare_vllm_rollouts, rollout_engine, rollouts_use_vllm

# The training libraries load when a round runs, not when a cached run imports the flow: the modules that import them
# at their top (tasks/training/probe.py, agents/trainer_args.py: transformers) are imported inside the functions.
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_pipeline.tasks.training.probe import HeldOutAccuracyProbe


def trl_grpo_args(
    cfg: GRPOStageConfig, common: dict[str, Any], weights: list[float], num_processes: int = 1, round_index: int = 1
) -> GRPOConfig:
    """Map the pipeline's GRPO section (batch fields in prompts and generations) onto TRL's GRPOConfig for round
    `round_index` (its peak learning rate); the batch stays global, each of `num_processes` processes taking its
    share of the step's completions."""
    from trl import GRPOConfig

    from grpo_pipeline.agents.trainer_args import agent_args

    use_vllm = rollouts_use_vllm(cfg)
    if cfg.vllm_mode == "server" and not use_vllm:
        logger.warning(
            "grpo.vllm_mode is 'server' but vLLM is not used here (use_vllm: auto needs CUDA and the vllm package); "
            "rollouts are generated with transformers in the training process"
        )
    if not use_vllm and (asked := vllm_corrections_set(cfg)):
        logger.warning("%s correct vLLM rollouts; vLLM is not used here, so they have no effect", ", ".join(asked))
    return GRPOConfig(
        **common,
        max_steps=cfg.steps_per_round,
        learning_rate=cfg.round_learning_rate(round_index),
        # transformers' cosine and linear schedules warm up themselves; its plain constant one does not
        lr_scheduler_type="constant_with_warmup"
        if cfg.lr_schedule == "constant" and cfg.warmup_ratio
        else cfg.lr_schedule,
        warmup_steps=cfg.warmup_ratio,
        # TRL counts the batch in completions: one optimizer step sees prompts_per_step groups of G completions.
        per_device_train_batch_size=cfg.prompts_per_step * cfg.generations_per_prompt // num_processes,
        gradient_accumulation_steps=1,
        num_generations=cfg.generations_per_prompt,
        max_completion_length=cfg.max_completion_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        # the objective (loss type, clipping, entropy, off-policy corrections), each under TRL's own name
        **cfg.algorithm(),
        reward_weights=weights,
        use_vllm=use_vllm,
        vllm_mode=cfg.vllm_mode,
        # server: TRL's client connects to a `trl vllm-serve` process and pushes the weights to it after each step
        # (a base URL, when given, wins over host and port). colocate: vLLM shares this process's GPU.
        vllm_server_base_url=cfg.vllm_server_base_url,
        vllm_server_host=cfg.vllm_server_host,
        vllm_server_port=cfg.vllm_server_port,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        logging_steps=cfg.log_every_steps,
        # Log a NaN/inf loss as it is (transformers would replace it by the running mean), so that the training-health
        # monitor (tasks/training/health.py) sees it.
        logging_nan_inf_filter=False,
        # tool use: the turn limit (docs/agents.md); nothing without grpo.tools or grpo.environment
        **agent_args(cfg),
    )


class GRPORound(BaseModel):
    """Everything one GRPO round trains from, as one typed value: the pipeline builds it once and every path passes it
    whole (in process, to launched processes through a job file, and to the `grpo-train` deployment on a work pool as
    its flow parameter), so an input added here reaches every path or fails validation on it."""

    model_config = ConfigDict(frozen=True)

    start: Checkpoint = Field(description="The policy the round starts from; TRL's reference model is built from it.")
    train: Ref = Field(description="The prompts it trains on: the training split, or the difficulty filter's rows.")
    cfg: GRPOStageConfig = Field(description="The grpo: section.")
    model_cfg: ModelConfig = Field(description="The model: section (LoRA adapters, precision).")
    round_index: int = Field(ge=1, description="1 for its stage's first round; seeds the round, names its outputs.")
    stage: str = Field(default="", description="The stage of a staged recipe the round belongs to (names outputs).")
    ctx: RunContext = Field(description="The run: its directory, seed, MLflow experiment and process count.")
    held_out: Ref | None = Field(
        default=None, description="The probe split: its first cfg.probe_problems rows are probed during the round."
    )
    correctness_reward: RewardSpec = Field(
        default=CORRECTNESS, description="What the probe scores by (eval.correctness_reward)."
    )
    monitors: MonitorsConfig = Field(default_factory=MonitorsConfig, description="The training-health alarms.")
    # where the user's modules live: it tells a worker elsewhere where to import them from, and changes no result
    code_dir: str | None = Field(default=None, json_schema_extra=UNKEYED, description="The recipe's directory.")

    @property
    def name(self) -> str:
        """The round's one name (`round_name`), which its stage folder and task run are formatted from."""
        return round_name(self.round_index, self.stage)


def _rewards_code(params: Mapping[str, Any]) -> dict[str, str]:
    """The user's code the round runs: its rewards' modules and its tools' and environment's (agents/)."""
    spec: GRPORound = params["spec"]
    return user_code([*(r.name for r in spec.cfg.rewards), spec.correctness_reward.name]) | tool_code(spec.cfg)


def tool_code(cfg: GRPOStageConfig) -> dict[str, str]:
    """`{dotted path: source fingerprint}` of the user's tools and environment (built-in tools are project code,
    keyed with the stage's own), as a user reward's are."""
    return user_code([*cfg.tools, *([cfg.environment] if cfg.environment else [])])


def round_callbacks(
    cfg: GRPOStageConfig,
    tokenizer: PreTrainedTokenizerBase,
    held_out: Ref | None,
    correctness_reward: RewardSpec,
    health: RoundHealth | None,
    notes: list[str] | None = None,
) -> list[TrainerCallback]:
    """The round's own trainer callbacks: the held-out accuracy probe (with `held_out`, the probe split, and
    `cfg.probe_problems`; it keeps the best-probed step with `cfg.keep: best_probe` and says so in `notes`) and the
    training-health watch (with `health`)."""
    from grpo_pipeline.tasks.training.probe import HeldOutAccuracyProbe

    callbacks: list[TrainerCallback] = []
    rows = pd.read_parquet(held_out.require()).head(cfg.probe_problems) if held_out is not None else None
    if rows is not None and len(rows) and cfg.probe_problems:
        keep = {"keep_best": cfg.keep == "best_probe", "patience": cfg.probe_patience, "notes": notes,
                "over_start": cfg.keep_over_start, "rule": cfg.keep_rule, "margin": cfg.keep_margin}  # fmt: skip
        probe = HeldOutAccuracyProbe(
            rows, tokenizer, cfg.probe_every_steps, cfg.sampling.greedy(), correctness_reward, **keep
        )
        callbacks.append(probe)
    elif cfg.keep == "best_probe":
        raise ConfigError(
            "grpo.keep is 'best_probe' but this round has no probe rows to choose the step by; set data.num_probe"
        )
    if health is not None:
        callbacks.append(health_callback(health))
    return callbacks


def round_health(
    cfg: GRPOStageConfig,
    monitors: MonitorsConfig,
    stage_name: str,
    weights: list[float],
    correctness_reward: RewardSpec,
) -> RoundHealth:
    """The round's health watch; the correctness reward, when it is one of the round's rewards, tells solved groups
    (saturation) from unsolved ones (the zero_spread alarm)."""
    names = [spec.name for spec in cfg.rewards]
    index = names.index(correctness_reward.name) if correctness_reward.name in names else None
    turns = cfg.max_tool_turns if cfg.sampling.uses_tools else None  # the turn_limit alarm watches tool-using rounds
    return RoundHealth(monitors, stage_name, cfg.beta, cfg.generations_per_prompt, weights, index, turns)


def round_name(round_index: int, stage: str = "") -> str:
    """The one name of GRPO round `round_index` (of `stage`, in a staged recipe): its task run, MLflow run, output
    folder and progress artifact (`GRPORound.name`, which the stage folder and the task run names are formatted
    from)."""
    return f"grpo-{stage}-round{round_index}" if stage else f"grpo-round{round_index}"


def round_label(round_index: int, stage: str = "") -> str:
    """The short label of GRPO round `round_index` (of `stage`) in the names of the stages around it: `r2` for
    `difficulty_filter-r2`, `evaluate-r2`, `register-r2`; `<stage>-r2` in a staged recipe."""
    return f"{stage}-r{round_index}" if stage else f"r{round_index}"


@stage("{spec.name}", external=_rewards_code)
@launched
def grpo_train(spec: GRPORound, *, out: Path) -> Checkpoint:
    """One GRPO round from `spec.start`: the policy checkpoint, with its MLflow run id and the round's health alarms.

    With `spec.held_out` (the probe split), greedy accuracy on its first `cfg.probe_problems` rows is logged during
    training, and with `cfg.keep: best_probe` the round returns its best-probed step. `spec.monitors` sets the health
    alarms (tasks/training/health.py); with `monitors.fail_fast` the first alarm stops the round with
    TrainingHealthError.
    """
    from trl import GRPOTrainer

    start, cfg, ctx, monitors, round_index = spec.start, spec.cfg, spec.ctx, spec.monitors, spec.round_index
    correctness_reward = spec.correctness_reward
    stage_name = spec.name
    reward_fns, weights = build_rewards(cfg.rewards)
    health = round_health(cfg, monitors, stage_name, weights, correctness_reward)
    if monitors.enabled:
        reward_fns = health.wrap_rewards(reward_fns)  # records each step's rewards for the zero-spread reading
    dataset = load_split(spec.train.require())
    dataset = dataset.remove_columns([c for c in dataset.column_names if c == "completion"])  # SFT's target
    watch = health if monitors.enabled else None
    objective: dict[str, Any] = {}  # what TRL's trainer runs with, read back from it: the round's meta records it
    # filled in during training, saved after it
    meta = {"round": round_index, "alarms": health.alarms, "notes": health.notes, "objective": objective}

    probes: list[HeldOutAccuracyProbe] = []  # the round's probe, read after training: what the round returned

    def build(common: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> GRPOTrainer:
        from grpo_pipeline.agents.text_tools import text_rollout_kwargs
        from grpo_pipeline.agents.trainer_args import trainer_agent_kwargs
        from grpo_pipeline.tasks.training.probe import HeldOutAccuracyProbe

        args = trl_grpo_args(cfg, common, weights, ctx.num_processes, round_index)
        callbacks = round_callbacks(cfg, tokenizer, spec.held_out, correctness_reward, watch, health.notes)
        probes.extend(c for c in callbacks if isinstance(c, HeldOutAccuracyProbe))
        prepare_vllm_rollouts(args.use_vllm and args.vllm_mode == "colocate")
        meta["rollouts"] = rollout_engine(args.use_vllm, args.vllm_mode)
        trainer = GRPOTrainer(
            model=start.path,
            reward_funcs=reward_fns,
            args=args,
            train_dataset=conversational_dataset(dataset, tokenizer, start.path),
            processing_class=tokenizer,
            callbacks=callbacks,
            **adapter_args(spec.model_cfg),
            **trainer_agent_kwargs(cfg, tokenizer),
            **text_rollout_kwargs(cfg, tokenizer),  # tools on a model without a tool template: calls in text
        )
        objective.update({name: getattr(trainer.args, name) for name in PolicyLossConfig.model_fields})
        return trainer

    policy = train_policy(
        start, ctx, spec.model_cfg, stage=stage_name, seed=ctx.seed + round_index, out=out,
        tags={"stage": "grpo", "round": str(round_index), "data_fingerprint": spec.train.fingerprint},
        build=build, save_every_steps=cfg.save_every_steps, keep_checkpoints=cfg.keep_checkpoints, meta=meta,
    )  # fmt: skip
    outcome = {"alarms": tuple(health.alarms), "notes": tuple(health.notes), "rollouts": meta.get("rollouts", "")}
    if probes:
        outcome.update(kept_start=probes[0].kept_start, probe_accuracy=probes[0].kept_accuracy)
    return policy.model_copy(update=outcome)
