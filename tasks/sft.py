"""Stage 3, sft_warmup: supervised fine-tuning on prompt/completion pairs with TRL's SFTTrainer.

The loss is on completion tokens only (TRL's default for prompt-completion data), and TRL appends the EOS token
to each completion, so the model learns to stop. Chat prompts (data.prompt_format: chat) go to TRL in its
conversational prompt-completion format, so the tokenizer's chat template frames both (its end of the assistant's
turn then ends the completion).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.configs.schema import CORRECTNESS, ConfigError, ModelConfig, RewardSpec, SFTStageConfig
from grpo_pipeline.tasks.core.chat import conversational_dataset
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.launch import launched
from grpo_pipeline.tasks.core.stage import RunContext, code_version, stage, user_code
from grpo_pipeline.tasks.training.trainer import adapter_args, load_split, train_policy

if TYPE_CHECKING:  # the training libraries load when SFT runs, not when a cached run imports the flow
    from transformers import PreTrainedTokenizerBase, TrainerCallback
    from trl import SFTTrainer


PROBE_MODULE = "grpo_pipeline.tasks.training.probe"
BAR_PROBE = Sampling(temperature=None, max_new_tokens=64)  # the bar's probe completions unless told: greedy, plain


def _bar_code(params: Mapping[str, Any]) -> dict[str, str]:
    """With `sft.stop_at_accuracy`, SFT also runs the probe and the correctness reward: their code keys it then. The
    probe is imported by name (`bar_probe`), so that without the bar a reward edit does not rerun SFT."""
    if params["cfg"].stop_at_accuracy is None:
        return {}
    sampling = params.get("probe_sampling", BAR_PROBE)
    return {
        "probe": code_version(PROBE_MODULE),
        **user_code([params["correctness_reward"].name, *sampling.tools, sampling.environment or ""]),
    }


@stage("sft", external=_bar_code)
@launched
def sft_warmup(
    base: Checkpoint,
    train: Ref,
    cfg: SFTStageConfig,
    model_cfg: ModelConfig,
    ctx: RunContext,
    probe: Ref | None = None,
    correctness_reward: RewardSpec = CORRECTNESS,
    probe_sampling: Sampling = BAR_PROBE,
    *,
    out: Path,
) -> Checkpoint:
    """Fine-tune `base` on the training split; returns the saved checkpoint (with its MLflow run id).

    With `cfg.stop_at_accuracy` and `probe` (the probe split), greedy accuracy on `probe` (judged by
    `correctness_reward`, completions as `probe_sampling` makes them: evaluation's, decoded greedily) is measured
    every `cfg.probe_every_steps` steps, and SFT ends at the first probe that reaches the bar; the checkpoint's
    `notes` say where it ended. With tools or an environment in `probe_sampling`, each probe completion is an
    episode, as evaluation runs it: an SFT that learned to call is measured with the tool's results, not cut at its
    first call."""
    from trl import SFTTrainer

    dataset = load_split(train.require(), ["prompt", "completion"])

    def build(common: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> SFTTrainer:
        train_dataset = conversational_dataset(dataset, tokenizer, base.path)
        return SFTTrainer(
            model=base.path,
            args=sft_args(cfg, common, ctx.num_processes),
            train_dataset=train_dataset,
            processing_class=tokenizer,
            callbacks=bar_probe(cfg, tokenizer, probe, correctness_reward, probe_sampling, notes),
            **adapter_args(model_cfg),
        )

    notes: list[str] = []
    policy = train_policy(
        base,
        ctx,
        model_cfg,
        stage="sft",
        seed=ctx.seed,
        out=out,
        tags={"data_fingerprint": train.fingerprint},
        build=build,
        save_every_steps=cfg.save_every_steps,
        keep_checkpoints=cfg.keep_checkpoints,
        meta={"notes": notes},
    )
    return policy.model_copy(update={"notes": tuple(notes)})


def sft_args(cfg: SFTStageConfig, common: dict[str, Any], num_processes: int) -> Any:
    """TRL's SFTConfig for the stage: `common` (the arguments SFT and GRPO share: output folder, seed, precision,
    checkpoints) and the recipe's schedule, with the batch kept global over `num_processes`."""
    from trl import SFTConfig

    return SFTConfig(
        **common,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=cfg.warmup_ratio,  # TRL/transformers 5 read a float below 1 as a fraction of the steps
        weight_decay=cfg.weight_decay,
        per_device_train_batch_size=cfg.batch_size // num_processes,  # the batch stays global
        logging_steps=10,
    )


def bar_probe(
    cfg: SFTStageConfig,
    tokenizer: PreTrainedTokenizerBase,
    probe: Ref | None,
    correctness_reward: RewardSpec,
    sampling: Sampling,
    notes: list[str],
) -> list[TrainerCallback]:
    """The probe that ends SFT at `cfg.stop_at_accuracy` (none without the bar), on `sampling`'s completions (tool
    episodes where it has tools or an environment, agents/loops.py `eval_tool_loop`)."""
    if cfg.stop_at_accuracy is None:
        return []
    if probe is None:
        raise ConfigError("sft.stop_at_accuracy needs the probe split to measure; set data.num_probe (e.g. 128)")
    import pandas as pd

    rows = pd.read_parquet(probe.require()).head(cfg.probe_problems)
    module = importlib.import_module(PROBE_MODULE)  # with its tool loops (agents/), keyed only with the bar
    return [
        module.HeldOutAccuracyProbe(
            rows, tokenizer, cfg.probe_every_steps, sampling, correctness_reward,
            notes=notes, stop_at=cfg.stop_at_accuracy, steps_after_bar=cfg.steps_after_bar,
        )
    ]  # fmt: skip
