"""Stage 3, sft_warmup: supervised fine-tuning on prompt/completion pairs with TRL's SFTTrainer.

The loss is on completion tokens only (TRL's default for prompt-completion data), and TRL appends the EOS token
to each completion, so the model learns to stop. Chat prompts (data.prompt_format: chat) go to TRL in its
conversational prompt-completion format, so the tokenizer's chat template frames both (its end of the assistant's
turn then ends the completion).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.schema import ModelConfig, SFTStageConfig
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.launch import launched
from grpo_pipeline.tasks.core.stage import RunContext, stage
from grpo_pipeline.tasks.scoring.chat import conversational_dataset
from grpo_pipeline.tasks.training.trainer import adapter_args, load_split, train_policy

if TYPE_CHECKING:  # the training libraries load when SFT runs, not when a cached run imports the flow
    from transformers import PreTrainedTokenizerBase
    from trl import SFTTrainer


@stage("sft")
@launched
def sft_warmup(
    base: Checkpoint, train: Ref, cfg: SFTStageConfig, model_cfg: ModelConfig, ctx: RunContext, out: Path
) -> Checkpoint:
    """Fine-tune `base` on the training split; returns the saved checkpoint (with its MLflow run id)."""
    from trl import SFTConfig, SFTTrainer

    dataset = load_split(train.require(), ["prompt", "completion"])

    def build(common: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> SFTTrainer:
        args = SFTConfig(
            **common,
            num_train_epochs=cfg.epochs,
            max_steps=cfg.max_steps,
            learning_rate=cfg.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=cfg.warmup_ratio,  # TRL/transformers 5 read a float below 1 as a fraction of the steps
            weight_decay=cfg.weight_decay,
            per_device_train_batch_size=cfg.batch_size // ctx.num_processes,  # the batch stays global
            logging_steps=10,
        )
        train_dataset = conversational_dataset(dataset, tokenizer, base.path)
        return SFTTrainer(
            model=base.path,
            args=args,
            train_dataset=train_dataset,
            processing_class=tokenizer,
            **adapter_args(model_cfg),
        )

    return train_policy(
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
    )
