"""Stage 3, sft_warmup: supervised fine-tuning on prompt/completion pairs with TRL's SFTTrainer.

The loss is on completion tokens only (TRL's default for prompt-completion data), and TRL appends the EOS token
to each completion, so the model learns to stop.
"""

from __future__ import annotations

import tempfile

from trl import SFTConfig as TRLSFTConfig
from trl import SFTTrainer

from grpo_pipeline.configs.schema import ModelConfig, SFTConfig, section_hash
from grpo_pipeline.tasks.common import Checkpoint, Ref, logger, stage_dir
from grpo_pipeline.tasks.tracking import mlflow_run
from grpo_pipeline.tasks.training import load_split, load_tokenizer, precision_args, save_checkpoint


def sft_warmup(
    base: Checkpoint,
    train: Ref,
    cfg: SFTConfig,
    model_cfg: ModelConfig,
    run_dir: str,
    experiment: str,
    recipe: str,
    seed: int,
) -> Checkpoint:
    """Fine-tune `base` on the training split; returns the saved checkpoint (with its MLflow run id)."""
    key = section_hash({"sft": cfg.model_dump(), "base": base.fingerprint, "train": train.fingerprint, "seed": seed})
    out = stage_dir(run_dir, "sft", key)
    tokenizer = load_tokenizer(base.path)
    dataset = load_split(train.require(), ["prompt", "completion"])
    tags = {"stage": "sft", "parent_model": base.parent or base.path, "data_fingerprint": train.fingerprint}
    with mlflow_run(run_dir, experiment, f"{recipe}-sft", tags) as run, tempfile.TemporaryDirectory() as scratch:
        args = TRLSFTConfig(
            output_dir=scratch,
            num_train_epochs=cfg.epochs,
            max_steps=cfg.max_steps,
            learning_rate=cfg.learning_rate,
            lr_scheduler_type="cosine",
            warmup_steps=cfg.warmup_ratio,
            weight_decay=cfg.weight_decay,
            per_device_train_batch_size=cfg.batch_size,
            logging_steps=10,
            save_strategy="no",
            report_to=["mlflow"],
            seed=seed,
            dataloader_num_workers=0,
            **precision_args(model_cfg),
        )
        trainer = SFTTrainer(model=base.path, args=args, train_dataset=dataset, processing_class=tokenizer)
        result = trainer.train()
        logger.info("SFT finished: %d steps, train loss %.4f", result.global_step, result.training_loss)
        return save_checkpoint(
            trainer,
            tokenizer,
            out,
            {"stage": "sft", "steps": result.global_step, "train_loss": result.training_loss},
            run_id=run.info.run_id,
            parent=base.path,
            stage="sft",
        )
