"""The `sft:` section: the supervised warmup before GRPO (tasks/sft.py)."""

from __future__ import annotations

from pydantic import Field

from grpo_pipeline.configs.base import UNKEYED, Section, save_every_steps_field


class SFTStageConfig(Section):
    enabled: bool = Field(default=True, description="Run the SFT warmup; when false GRPO starts from the base model.")
    epochs: float = Field(default=3.0, gt=0, description="Passes over the training split.")
    max_steps: int = Field(default=-1, description="Stop after this many optimizer steps (-1: use epochs).")
    learning_rate: float = Field(default=1e-3, gt=0, description="Peak learning rate.")
    batch_size: int = Field(default=64, ge=1, description="Examples per optimizer step.")
    warmup_ratio: float = Field(default=0.05, ge=0, le=1, description="Fraction of steps for linear warmup.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    stop_at_accuracy: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="End SFT at the first probe whose greedy accuracy on the probe split (data.num_probe rows, never "
        "the eval items) reaches this, max_steps being the cap: a warmup whose hard part is learned after a plateau "
        "of seed-dependent length runs as long as that seed needs. None: run to max_steps.",
    )
    steps_after_bar: int = Field(
        default=0,
        ge=0,
        description="With stop_at_accuracy: go on this many steps after the probe first reaches the bar, the "
        "learning rate decaying to 0 over them (a cosine on top of the schedule), then end (max_steps still caps "
        "it). The bar says the warmup has left its plateau; these steps let it settle, annealed, into what its data "
        "teaches instead of stopping in the middle of the jump. After a resume the count starts again at the first "
        "probe that reaches the bar.",
    )
    probe_every_steps: int = Field(default=250, ge=1, description="Steps between two probes (with stop_at_accuracy).")
    probe_problems: int = Field(default=128, ge=1, description="Probe-split rows the SFT probe measures.")
    save_every_steps: int = save_every_steps_field(500)
    keep_checkpoints: int = Field(
        default=2, ge=1, json_schema_extra=UNKEYED, description="Resumable checkpoints kept (the newest ones)."
    )
