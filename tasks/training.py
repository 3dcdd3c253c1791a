"""The trainer scaffold that SFT and GRPO share: TRL's common arguments, the MLflow run, the atomic save.

A training stage supplies only what differs: its dataset, its own TRL config fields and its trainer class
(`build`). Everything else (scratch output directory, seed, precision, reporting to MLflow, saving model +
tokenizer + meta.json atomically, the Checkpoint it returns) happens here once.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.schema import ModelConfig
from grpo_pipeline.tasks.checkpoints import (
    SealCheckpoints,
    latest_complete,
    remember_run_id,
    remembered_run_id,
    resume_dir,
)
from grpo_pipeline.tasks.common import Checkpoint, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.stage import RunContext
from grpo_pipeline.tasks.tracking import mlflow_run

if TYPE_CHECKING:  # torch, datasets and transformers load when a stage trains, not when the flow is imported
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, Trainer

# build(common TRL arguments, tokenizer) -> a ready trainer
TrainerFactory = Callable[[dict[str, Any], "PreTrainedTokenizerBase"], "Trainer"]


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def vllm_available() -> bool:
    return has_cuda() and importlib.util.find_spec("vllm") is not None


def precision_args(model_cfg: ModelConfig) -> dict[str, Any]:
    """TrainingArguments for the configured dtype; bf16/fp16 only where CUDA is present."""
    import torch

    return {
        "bf16": model_cfg.dtype == "bfloat16" and has_cuda(),
        "fp16": model_cfg.dtype == "float16" and has_cuda(),
        "model_init_kwargs": {"dtype": model_cfg.dtype if model_cfg.dtype != "float32" else torch.float32},
    }


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_split(path: Path, columns: list[str] | None = None) -> Dataset:
    from datasets import Dataset

    ds = Dataset.from_parquet(str(path))
    if columns is not None:
        ds = ds.select_columns(columns)
    return ds


def train_policy(
    start: Checkpoint,
    ctx: RunContext,
    model_cfg: ModelConfig,
    *,
    stage: str,
    seed: int,
    out: Path,
    tags: dict[str, str],
    build: TrainerFactory,
    save_every_steps: int = 0,
    keep_checkpoints: int = 2,
    meta: dict[str, Any] | None = None,
) -> Checkpoint:
    """Train from `start` in an MLflow run named `<recipe>-<stage>` and save the result atomically into `out`.

    `tags` go on the MLflow run after the defaults (`stage`, `parent_model`), so a caller can refine them.

    `build` gets the arguments every TRL config here shares (pass them on with the stage's own fields) and the
    start checkpoint's tokenizer, and returns the trainer. With `save_every_steps`, the Trainer saves a resumable
    checkpoint that often (the last `keep_checkpoints` kept) in `resume_dir(out)`, and a call that finds a sealed one
    there (a rerun after a crash, a Prefect retry) resumes from the newest, in the same MLflow run; see
    tasks/checkpoints.py. The model appears in `out` complete or not at all, and the resume folder then goes.
    """
    from grpo_pipeline.tasks.progress import PrefectProgress

    tokenizer = load_tokenizer(start.path)
    tags = {"stage": stage, "parent_model": start.lineage, **tags}
    resume = resume_dir(out)
    last = latest_complete(resume, stage) if save_every_steps else None
    resumed_from = None
    if last is not None:
        resumed_from = json.loads((last / "trainer_state.json").read_text())["global_step"]
        logger.info("%s: resuming from step %d (%s)", stage, resumed_from, last)
    run_id = remembered_run_id(resume) if last is not None else None  # metrics go on in the run that logged them
    with (
        mlflow_run(ctx.run_dir, ctx.experiment, f"{ctx.recipe}-{stage}", tags, resume=run_id) as run,
        tempfile.TemporaryDirectory() as scratch,
    ):
        common = {
            "output_dir": scratch,
            "save_strategy": "no",
            "report_to": ["mlflow"],
            "seed": seed,
            "dataloader_num_workers": 0,
            **precision_args(model_cfg),
        }
        if save_every_steps:
            remember_run_id(resume, run.info.run_id)
            common |= {
                "output_dir": str(resume),
                "save_strategy": "steps",
                "save_steps": save_every_steps,
                "save_total_limit": keep_checkpoints,
            }
        trainer = build(common, tokenizer)
        trainer.add_callback(PrefectProgress(stage))
        trainer.add_callback(SealCheckpoints())
        result = trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
        logger.info("%s finished: %d steps, train loss %.4f", stage, result.global_step, result.training_loss)
        meta = {
            "stage": stage,
            "steps": result.global_step,
            "train_loss": result.training_loss,
            "resumed_from_step": resumed_from,
            **(meta or {}),
        }
        with atomic_dir(out) as tmp:
            trainer.save_model(str(tmp))
            tokenizer.save_pretrained(str(tmp))
            (tmp / "training_args.bin").unlink(missing_ok=True)  # a pickle of trainer args: not part of the model
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    shutil.rmtree(resume, ignore_errors=True)
    return Checkpoint(
        path=str(out),
        fingerprint=fingerprint_path(out),
        run_id=run.info.run_id,
        parent=start.lineage,
        stage=stage,
        resumed_from_step=resumed_from,
    )
