"""Stage 4, grpo_train: Group Relative Policy Optimization with TRL's GRPOTrainer.

GRPO (Shao et al. 2024, "DeepSeekMath", sec. 4.1) samples a group of G completions per prompt, scores them with
the reward functions, and uses each completion's reward relative to its group (r - mean) / std as the advantage,
so no value model is needed. Iterative GRPO (sec. 4.2) is a sequence of rounds: each round starts from the last
round's policy and, because TRL builds the reference model from the starting checkpoint's *path*, the reference
is reset to that policy too (only matters when beta > 0).
"""

from __future__ import annotations

import tempfile

import pandas as pd
from trl import GRPOConfig as TRLGRPOConfig
from trl import GRPOTrainer

from grpo_pipeline.configs.schema import GRPOConfig, ModelConfig, section_hash
from grpo_pipeline.rewards import build_rewards
from grpo_pipeline.tasks.common import Checkpoint, Ref, logger, stage_dir
from grpo_pipeline.tasks.curves import HeldOutAccuracyProbe
from grpo_pipeline.tasks.tracking import mlflow_run
from grpo_pipeline.tasks.training import load_split, load_tokenizer, precision_args, save_checkpoint, vllm_available


def trl_grpo_args(cfg: GRPOConfig, model_cfg: ModelConfig, output_dir: str, seed: int, weights: list[float]) -> TRLGRPOConfig:
    """Map the pipeline's GRPO section (batch fields in prompts and generations) onto TRL's GRPOConfig."""
    use_vllm = vllm_available() if cfg.use_vllm == "auto" else bool(cfg.use_vllm)
    return TRLGRPOConfig(
        output_dir=output_dir,
        max_steps=cfg.steps_per_round,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant_with_warmup" if cfg.warmup_ratio else "constant",
        warmup_steps=cfg.warmup_ratio,
        # TRL counts the batch in completions: one optimizer step sees prompts_per_step groups of G completions.
        per_device_train_batch_size=cfg.prompts_per_step * cfg.generations_per_prompt,
        gradient_accumulation_steps=1,
        num_generations=cfg.generations_per_prompt,
        max_completion_length=cfg.max_completion_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        beta=cfg.beta,
        epsilon=cfg.epsilon,
        loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards,
        reward_weights=weights,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        logging_steps=cfg.log_every_steps,
        save_strategy="no",
        report_to=["mlflow"],
        seed=seed,
        dataloader_num_workers=0,
        **precision_args(model_cfg),
    )


def grpo_train(
    start: Checkpoint,
    train: Ref,
    cfg: GRPOConfig,
    model_cfg: ModelConfig,
    round_index: int,
    run_dir: str,
    experiment: str,
    recipe: str,
    seed: int,
    held_out: Ref | None = None,
    correctness_reward: str = "correctness",
) -> Checkpoint:
    """One GRPO round from `start`; returns the policy checkpoint (with its MLflow run id).

    With `held_out`, greedy accuracy on its first `cfg.probe_problems` rows is logged during training.
    """
    key = section_hash(
        {"grpo": cfg.model_dump(), "start": start.fingerprint, "train": train.fingerprint, "round": round_index, "seed": seed}
    )
    out = stage_dir(run_dir, f"grpo-round{round_index}", key)
    reward_fns, weights = build_rewards(cfg.rewards)
    tokenizer = load_tokenizer(start.path)
    dataset = load_split(train.require())
    if "completion" in dataset.column_names:  # the SFT target; TRL would pass it to rewards as a column
        dataset = dataset.remove_columns("completion")
    run_tags = {
        "stage": "grpo",
        "round": str(round_index),
        "parent_model": start.path,
        "data_fingerprint": train.fingerprint,
    }
    with mlflow_run(run_dir, experiment, f"{recipe}-grpo-r{round_index}", run_tags) as run, tempfile.TemporaryDirectory() as scratch:
        args = trl_grpo_args(cfg, model_cfg, scratch, seed + round_index, weights)
        callbacks = []
        if held_out is not None and cfg.probe_problems:
            rows = pd.read_parquet(held_out.require()).head(cfg.probe_problems)
            callbacks.append(
                HeldOutAccuracyProbe(rows, tokenizer, cfg.probe_every_steps, cfg.max_completion_tokens, correctness_reward)
            )
        trainer = GRPOTrainer(
            model=start.path,
            reward_funcs=reward_fns,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
        result = trainer.train()
        logger.info("GRPO round %d finished: %d steps", round_index, result.global_step)
        return save_checkpoint(
            trainer,
            tokenizer,
            out,
            {"stage": "grpo", "round": round_index, "steps": result.global_step, "use_vllm": args.use_vllm},
            run_id=run.info.run_id,
            parent=start.path,
            stage=f"grpo-r{round_index}",
        )
