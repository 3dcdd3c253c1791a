"""The `distributed:` section: how many processes train SFT and GRPO, and how they are launched. Unkeyed: how a
stage runs, not what it computes (tasks/core/stage.py)."""

from __future__ import annotations

from pydantic import Field

from grpo_pipeline.configs.base import UNKEYED, Section


class DistributedConfig(Section):
    num_processes: int = Field(
        default=1,
        ge=1,
        json_schema_extra=UNKEYED,
        description="Processes that train SFT and GRPO together (data parallel, one per GPU, or gloo on CPU), "
        "started with `accelerate launch`; 1 trains in the pipeline's own process. The batch fields stay global: "
        "each process takes its share of sft.batch_size and of grpo.prompts_per_step x generations_per_prompt.",
    )
    accelerate_config: str | None = Field(
        default=None,
        json_schema_extra=UNKEYED,
        description="An accelerate config file for the launch (configs/accelerate/: ddp, fsdp2, zero2, zero3); "
        "unset: plain data parallel.",
    )
