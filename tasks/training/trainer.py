"""The trainer scaffold that SFT and GRPO share: TRL's common arguments, the MLflow run, the atomic save.

A training stage supplies only what differs: its dataset, its own TRL config fields and its trainer class
(`build`). Everything else (scratch output directory, seed, precision, reporting to MLflow, saving model +
tokenizer + meta.json atomically, the Checkpoint it returns) happens here once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.configs.schema import ConfigError, ModelConfig
from grpo_pipeline.tasks.core.common import (
    Checkpoint,
    atomic_dir,
    fingerprint_path,
    load_tokenizer,
    logger,
    staging_path,
)
from grpo_pipeline.tasks.core.jobs import LAUNCH_ID_ENV, is_main_process
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.core.tracking import mlflow_run
from grpo_pipeline.tasks.scoring.vllm_generation import vllm_installed
from grpo_pipeline.tasks.training.checkpoint_mirror import (
    RESUME_KEY_TAG,
    forget_mirrored,
    mirror_callback,
    mirrored,
    restore_mirrored,
    resume_key,
)
from grpo_pipeline.tasks.training.checkpoints import (
    latest_complete,
    remember_run_id,
    remembered_run_id,
    resume_dir,
    seal_callback,
)

if TYPE_CHECKING:  # torch, datasets and transformers load when a stage trains, not when the flow is imported
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, Trainer

# build(common TRL arguments, tokenizer) -> a ready trainer
TrainerFactory = Callable[[dict[str, Any], "PreTrainedTokenizerBase"], "Trainer"]


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def vllm_available() -> bool:
    return has_cuda() and vllm_installed()


def precision_args(model_cfg: ModelConfig) -> dict[str, Any]:
    """TrainingArguments for the configured dtype: bf16/fp16 autocast only where CUDA is present, the weights loaded
    in `weights_dtype`."""
    return {
        "bf16": model_cfg.dtype == "bfloat16" and has_cuda(),
        "fp16": model_cfg.dtype == "float16" and has_cuda(),
        "model_init_kwargs": {"dtype": weights_dtype(model_cfg)},
    }


def weights_dtype(model_cfg: ModelConfig) -> Any:
    """The dtype training loads the weights in: float32 master weights for full fine-tuning in mixed precision
    (model.train_precision), else `model.dtype` (a LoRA base is frozen; peft keeps the adapters in float32)."""
    import torch

    if model_cfg.train_precision == "mixed" and model_cfg.lora is None:
        return torch.float32
    return torch_dtype(model_cfg)


def precision_of(trainer: Trainer) -> dict[str, str]:
    """The dtypes training actually used, read from the trainer: trainable weights, optimizer state (Adam's first
    moment) and autocast."""
    weights = next((p.dtype for p in trainer.model.parameters() if p.requires_grad), "none")
    try:  # an optimizer of DeepSpeed's or FSDP's may keep its state elsewhere: then it is not known here
        moments = [s["exp_avg"].dtype for s in trainer.optimizer.state.values() if "exp_avg" in s]
    except (AttributeError, TypeError):
        moments = ["unknown"]
    autocast = "bf16" if trainer.args.bf16 else "fp16" if trainer.args.fp16 else "none"
    return {
        "weights": str(weights).removeprefix("torch."),
        "optimizer_state": str(moments[0]).removeprefix("torch.") if moments else "none",
        "autocast": autocast,
    }


def torch_dtype(model_cfg: ModelConfig) -> Any:
    import torch

    return torch.float32 if model_cfg.dtype == "float32" else model_cfg.dtype


def adapter_args(model_cfg: ModelConfig) -> dict[str, Any]:
    """The trainers' `peft_config` (model.lora) and `quantization_config` (model.load_in_4bit: QLoRA)."""
    if model_cfg.lora is None:
        return {}
    from peft import LoraConfig

    lora = model_cfg.lora
    args: dict[str, Any] = {
        "peft_config": LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )
    }
    if model_cfg.load_in_4bit:
        import torch
        from transformers import BitsAndBytesConfig

        args["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            # the dtype the 4-bit weights are computed in: model.dtype (float16 on GPUs without bf16, e.g. T4, V100)
            bnb_4bit_compute_dtype={"float16": torch.float16, "float32": torch.float32}.get(
                model_cfg.dtype, torch.bfloat16
            ),
        )
    return args


def check_model_runtime(model_cfg: ModelConfig) -> None:
    """Refuse, before anything runs, a model set-up this machine cannot train (4-bit weights without CUDA)."""
    if not model_cfg.load_in_4bit:
        return
    if not has_cuda():
        raise ConfigError(
            "model.load_in_4bit needs a CUDA GPU (bitsandbytes 4-bit weights) and this machine has none; drop "
            "model.load_in_4bit to train LoRA adapters (model.lora) on full-precision weights"
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("model.load_in_4bit needs bitsandbytes: pip install -e '.[gpu]'")


def load_split(path: Path, columns: list[str] | None = None) -> Dataset:
    from datasets import Dataset

    ds = Dataset.from_parquet(str(path))
    if columns is not None:
        ds = ds.select_columns(columns)
    return ds


def resume_point(resume: Path, stage: str, prune: bool) -> tuple[Path | None, int | None]:
    """The newest sealed checkpoint in `resume` and its step, or (None, None) when there is none to resume from."""
    last = latest_complete(resume, stage, prune=prune)
    if last is None:
        return None, None
    step = json.loads((last / "trainer_state.json").read_text())["global_step"]
    logger.info("%s: resuming from step %d (%s)", stage, step, last)
    return last, step


def resume_from(
    out: Path, stage: str, ctx: RunContext, tags: dict[str, str], main: bool
) -> tuple[Path | None, int | None, str | None]:
    """Where the stage writing `out` resumes: the checkpoint, its step and the MLflow run its metrics go on in, or
    (None, None, None) to start afresh. A Ray Train worker takes the newest checkpoint mirrored in MLflow (and names
    the stage in `tags` for the next attempt to find it; tasks/training/checkpoint_mirror.py); any other process the
    newest sealed one in the resume folder."""
    if mirrored():
        tags[RESUME_KEY_TAG] = resume_key(out)
        return restore_mirrored(resume_dir(out), stage, ctx, tags[RESUME_KEY_TAG])
    last, step = resume_point(resume_dir(out), stage, prune=main)
    return last, step, remembered_run_id(resume_dir(out)) if last is not None else None


def shared_args(output_dir: str, main: bool, seed: int, model_cfg: ModelConfig) -> dict[str, Any]:
    """The TRL config arguments every training stage shares (saving nothing until the end, MLflow from process 0)."""
    return {
        "output_dir": output_dir,
        "save_strategy": "no",
        "report_to": ["mlflow"] if main else "none",
        "seed": seed,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": has_cuda(),  # pinned memory needs an accelerator; torch warns on every loader
        # TRL's configs default checkpointing on; transformers 5.2x renamed it `activation_checkpointing` and warns on
        # every config built with the old name alone, which is all that releases before it know (vLLM's builds pin
        # those).
        checkpointing_arg(): True,
        **precision_args(model_cfg),
    }


def checkpointing_arg() -> str:
    """The name this transformers gives activation checkpointing in its TrainingArguments."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def checkpoint_args(resume: Path, save_every_steps: int, keep_checkpoints: int) -> dict[str, Any]:
    """The Trainer arguments that save a resumable checkpoint every `save_every_steps` steps into `resume`."""
    return {
        "output_dir": str(resume),
        "save_strategy": "steps",
        "save_steps": save_every_steps,
        "save_total_limit": keep_checkpoints,
    }


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
    tasks/training/checkpoints.py. The model appears in `out` complete or not at all, and the resume folder then goes.
    """
    from grpo_pipeline.tasks.training.progress import PrefectProgress, console_progress  # transformers: when training

    main = is_main_process()  # in a multi-process launch (tasks/core/launch.py), process 0 logs and saves
    tokenizer = load_tokenizer(start.path)
    tags = {"stage": stage, "parent_model": start.lineage, **tags}
    resume, mirror = resume_dir(out), bool(save_every_steps) and mirrored()
    last, resumed_from, run_id = resume_from(out, stage, ctx, tags, main) if save_every_steps else (None, None, None)
    tracked = mlflow_run(ctx.run_dir, ctx.experiment, f"{ctx.recipe}-{stage}", tags, resume=run_id)
    with tracked if main else contextlib.nullcontext() as run, tempfile.TemporaryDirectory() as scratch:
        common = shared_args(scratch, main, seed, model_cfg)
        if save_every_steps:
            if main:
                remember_run_id(resume, run.info.run_id)
            common |= checkpoint_args(resume, save_every_steps, keep_checkpoints)
        trainer = build(common, tokenizer)
        trainer.add_callback(PrefectProgress(stage))
        trainer.add_callback(mirror_callback(run.info.run_id if main else None) if mirror else seal_callback())
        with console_progress(trainer, stage):  # logs "<stage> finished: ..." with the stage's key numbers
            result = trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
        done = {"stage": stage, "steps": result.global_step, "train_loss": result.training_loss}
        done["precision"] = precision = precision_of(trainer)
        done |= {"resumed_from_step": resumed_from, "processes": trainer.accelerator.num_processes}
        save_policy(trainer, tokenizer, start, model_cfg, out, {**done, **(meta or {})})
    if main or mirror:  # a worker's copy on a disk of its own goes too
        shutil.rmtree(resume, ignore_errors=True)
    if main and mirror:
        forget_mirrored(run.info.run_id)
    return Checkpoint(
        path=str(out),
        fingerprint=fingerprint_path(out),
        run_id=run.info.run_id if main else None,
        parent=start.lineage,
        stage=stage,
        resumed_from_step=resumed_from,
        precision=precision_line(precision),
    )


def precision_line(precision: dict[str, str]) -> str:
    """E.g. 'float32 weights and optimizer state, bf16 autocast'."""
    weights, state, autocast = precision["weights"], precision["optimizer_state"], precision["autocast"]
    held = (
        f"{weights} weights and optimizer state" if weights == state else f"{weights} weights, {state} optimizer state"
    )
    return f"{held}, {'no' if autocast == 'none' else autocast} autocast"


def save_policy(
    trainer: Trainer,
    tokenizer: PreTrainedTokenizerBase,
    start: Checkpoint,
    model_cfg: ModelConfig,
    out: Path,
    meta: dict[str, Any],
) -> None:
    """Save the trained policy (model, tokenizer, meta.json) so that `out` appears complete or not at all.

    Every process takes part (a sharded model is gathered to process 0) and process 0 writes. A LoRA policy is
    saved merged: the adapter is applied to the start weights loaded in `model.dtype` (not 4-bit), so the next
    stage, round, evaluation and registered version get a plain model."""
    from peft import PeftModel

    accelerator = trainer.accelerator
    main = accelerator.is_main_process
    tag = os.environ.get(LAUNCH_ID_ENV) or uuid.uuid4().hex[:8]  # every process of a launch writes to one place
    lora = isinstance(accelerator.unwrap_model(trainer.model), PeftModel)
    with atomic_dir(out, tag) if main else contextlib.nullcontext(staging_path(out, tag)) as staging:
        accelerator.wait_for_everyone()  # the staging directory exists
        trainer.save_model(str(staging / "adapter" if lora else staging))
        accelerator.wait_for_everyone()
        if main:
            if lora:
                merge_adapter(start.path, staging / "adapter", model_cfg, staging)
                shutil.rmtree(staging / "adapter")
            tokenizer.save_pretrained(str(staging))
            (staging / "training_args.bin").unlink(missing_ok=True)  # a pickle of trainer args: not the model's
            (staging / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    accelerator.wait_for_everyone()


def merge_adapter(base: str, adapter: Path, model_cfg: ModelConfig, dest: Path) -> None:
    """The start model with a trained LoRA adapter merged into its weights, saved into `dest`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype(model_cfg))
    PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().save_pretrained(str(dest))
