"""The `distributed:` section: how many processes train SFT and GRPO, and how they are launched. Unkeyed: how a
stage runs, not what it computes (tasks/core/stage.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_pipeline.configs.base import UNKEYED, Section

# Ray's own resource names are case-sensitive ("CPU", "GPU", "memory"); a lowercase "cpu" would be read as a custom
# resource no node has, and the job would wait for it forever.
RAY_RESOURCE_CASE = {"cpu": "CPU", "gpu": "GPU", "tpu": "TPU", "MEMORY": "memory", "Memory": "memory"}


def _one_cpu() -> dict[str, float]:
    return {"CPU": 1.0}


class DistributedConfig(Section):
    backend: Literal["accelerate", "ray"] = Field(
        default="accelerate",
        json_schema_extra=UNKEYED,
        description="What starts the training processes: accelerate (`accelerate launch` on this machine, "
        "distributed.num_processes) or ray (a Ray Train job of distributed.num_workers workers, on a local Ray "
        "cluster or on distributed.ray_address; checkpoints and the result travel through MLflow's artifact store, "
        "so the nodes share no disk).",
    )
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
    num_workers: int = Field(
        default=1,
        ge=1,
        json_schema_extra=UNKEYED,
        description="backend ray: the Ray Train workers that train SFT and GRPO together (data parallel, gloo on "
        "CPU, NCCL on GPUs), placed by Ray on any node with their resources. The batch fields stay global: each "
        "worker takes its share, as each of num_processes does.",
    )
    resources_per_worker: dict[str, float] = Field(
        default_factory=_one_cpu,
        json_schema_extra=UNKEYED,
        description="backend ray: what each worker reserves, in Ray's resource names (case-sensitive), e.g. "
        "{CPU: 1} or {GPU: 1, CPU: 4}; a GPU makes the workers train on it.",
    )
    ray_address: str | None = Field(
        default=None,
        json_schema_extra=UNKEYED,
        description="backend ray: an existing cluster to run on (its head's host:port, 'auto', or "
        "ray://host:10001 for Ray Client); unset starts a local Ray cluster for the run. Workers on other machines "
        "log to MLflow at MLFLOW_TRACKING_URI, which must then be a tracking server they can reach.",
    )

    @property
    def world_size(self) -> int:
        """The processes that train together, whichever backend starts them."""
        return self.num_workers if self.backend == "ray" else self.num_processes

    @property
    def size_field(self) -> str:
        """The field that sets `world_size`, for messages."""
        return "distributed.num_workers" if self.backend == "ray" else "distributed.num_processes"

    @model_validator(mode="after")
    def _fields_of_the_other_backend(self) -> DistributedConfig:
        if self.backend == "accelerate":
            ray_only = {
                "num_workers": self.num_workers != 1,
                "resources_per_worker": self.resources_per_worker != _one_cpu(),
                "ray_address": self.ray_address is not None,
            }
            if given := [f"distributed.{name}" for name, set_ in ray_only.items() if set_]:
                raise ValueError(
                    f"distributed.backend is accelerate, which does not use {', '.join(given)}: set "
                    "distributed.backend=ray to train on a Ray cluster, or drop them (accelerate counts its processes "
                    "in distributed.num_processes)"
                )
            return self
        if self.num_processes != 1:
            raise ValueError(
                f"distributed.num_processes ({self.num_processes}) counts accelerate's processes; with "
                f"distributed.backend=ray set distributed.num_workers={self.num_processes} instead and drop "
                "distributed.num_processes"
            )
        if self.accelerate_config is not None:
            raise ValueError(
                "distributed.accelerate_config (FSDP, DeepSpeed) is for distributed.backend=accelerate; Ray Train "
                "trains plain data parallel here: unset distributed.accelerate_config, or use backend accelerate"
            )
        self._check_resources()
        return self

    def _check_resources(self) -> None:
        resources = self.resources_per_worker
        if not resources or any(v < 0 for v in resources.values()) or not any(resources.values()):
            raise ValueError(
                f"distributed.resources_per_worker ({resources}) must reserve something for each worker, with no "
                "negative amount, e.g. {CPU: 1} or {GPU: 1}"
            )
        if wrong := {name: RAY_RESOURCE_CASE[name] for name in resources if name in RAY_RESOURCE_CASE}:
            fixes = ", ".join(f"{name} -> {right}" for name, right in wrong.items())
            raise ValueError(
                f"distributed.resources_per_worker names {', '.join(wrong)}, which Ray would read as custom resources "
                f"no node has (its names are case-sensitive): rename {fixes}"
            )
