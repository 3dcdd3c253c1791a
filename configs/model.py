"""The `model:` section: the base model (the embedded tiny one or a checkpoint), its dtype, and LoRA / QLoRA
adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_pipeline.configs.base import Section


class TinyModelConfig(Section):
    # Llama-shaped: transformers maps Qwen2 checkpoints to Qwen2Tokenizer, which rebuilds a byte-level
    # pre-tokenizer and would drop the char tokenizer's whitespace.
    architecture: Literal["llama"] = Field(default="llama", description="Decoder family of the tiny model.")
    hidden_size: int = Field(default=128, ge=8, description="Width of the residual stream.")
    num_layers: int = Field(default=4, ge=1, description="Decoder layers.")
    num_heads: int = Field(default=4, ge=1, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(default=512, ge=8, description="MLP width.")
    max_positions: int = Field(default=128, ge=16, description="Longest sequence, prompt plus completion (tokens).")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        return self


class LoraAdapterConfig(Section):
    r: int = Field(default=16, ge=1, description="Rank of the adapter matrices.")
    alpha: int = Field(default=32, ge=1, description="Scaling numerator: the update is (alpha / r) * B @ A.")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Module names that get adapters (e.g. [q_proj, v_proj]), or 'all-linear' for every linear "
        "layer but the output head.",
    )


class ModelConfig(Section):
    base: str = Field(
        default="tiny",
        description="'tiny' builds the embedded char-level model locally; otherwise a hub name or a local "
        "directory loaded with from_pretrained.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        default="float32", description="Weights dtype for training; bfloat16 on GPUs."
    )
    train_precision: Literal["mixed", "pure"] = Field(
        default="mixed",
        description="'mixed': full fine-tuning keeps the weights and the optimizer state in float32 (master "
        "weights) and computes in `dtype` (bf16/fp16 autocast) where CUDA is present, as transformers' AMP does: a "
        "bfloat16 weight of ~0.02 cannot hold an update below ~1e-4, so pure bf16 training at lr 5e-6 leaves most "
        "weights unchanged. Policies are saved as trained (float32), so the next round starts from the same weights. "
        "LoRA adapters are float32 either way, over a frozen base in `dtype`. 'pure': weights and optimizer state in "
        "`dtype` (half the memory), for setups that keep float32 master weights themselves (DeepSpeed bf16, FSDP "
        "mixed precision); with float16 weights only those can train (fp16's loss scaler refuses float16 gradients), "
        "so pure float16 full fine-tuning without them is refused.",
    )
    lora: LoraAdapterConfig | None = Field(
        default=None,
        description="Train LoRA adapters (peft) instead of every weight; each stage saves the policy with its "
        "adapter merged in, so the next stage, round, evaluation and registered version see a plain model.",
    )
    load_in_4bit: bool = Field(
        default=False,
        description="QLoRA: load the frozen base weights in 4-bit NF4 (bitsandbytes, CUDA only) and train LoRA "
        "adapters on top; needs model.lora. The merged policy is saved in `dtype`.",
    )

    @model_validator(mode="after")
    def _qlora_needs_lora(self) -> ModelConfig:
        if self.load_in_4bit and self.lora is None:
            raise ValueError("load_in_4bit trains LoRA adapters on a 4-bit base; set model.lora (e.g. model.lora={})")
        return self
