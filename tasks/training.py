"""What SFT and GRPO share: hardware choices, dataset loading, and saving a finished checkpoint atomically."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from grpo_pipeline.configs.schema import ModelConfig
from grpo_pipeline.tasks.common import Checkpoint, atomic_dir, fingerprint_path


def has_cuda() -> bool:
    return torch.cuda.is_available()


def vllm_available() -> bool:
    return has_cuda() and importlib.util.find_spec("vllm") is not None


def precision_args(model_cfg: ModelConfig) -> dict[str, Any]:
    """TrainingArguments for the configured dtype; bf16/fp16 only where CUDA is present."""
    return {
        "bf16": model_cfg.dtype == "bfloat16" and has_cuda(),
        "fp16": model_cfg.dtype == "float16" and has_cuda(),
        "model_init_kwargs": {"dtype": model_cfg.dtype if model_cfg.dtype != "float32" else torch.float32},
    }


def load_tokenizer(path: str):
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_split(path: Path, columns: list[str] | None = None) -> Dataset:
    ds = Dataset.from_parquet(str(path))
    if columns is not None:
        ds = ds.select_columns(columns)
    return ds


def save_checkpoint(trainer, tokenizer, out: Path, meta: dict[str, Any], **fields: Any) -> Checkpoint:
    """Save model + tokenizer + meta.json into `out` atomically and return its Checkpoint."""
    with atomic_dir(out) as tmp:
        trainer.save_model(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "training_args.bin").unlink(missing_ok=True)  # a pickle of trainer args: not part of the model
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return Checkpoint(path=str(out), fingerprint=fingerprint_path(out), **fields)
